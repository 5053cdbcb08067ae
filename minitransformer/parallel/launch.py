"""`--tensor-parallel-size N`: run this same command as N MPI ranks, and make sure none outlives it.

The process the user started becomes a supervisor: it runs `mpiexec -n N python -m minitransformer <the same
arguments>` (MPICH's launcher, from the mpich wheel next to this Python), forwards the ranks' output, and returns
rank 0's exit code. Rank 0 does what one process would have done; the others serve forwards (driver.py).

Nothing is left running, whatever happens:
  - normal end or an error on rank 0: rank 0 tells the workers to stop, every rank exits, mpiexec returns its code;
  - a rank dies (killed, crashed, out of memory): mpiexec's Hydra sees it and kills the other ranks (MPI's default
    is to end the whole job); the supervisor reports that a rank died instead of waiting;
  - Ctrl-C, SIGTERM or SIGHUP on the supervisor: it sends SIGTERM to mpiexec, which passes it to every rank, and
    SIGKILL after STOP_GRACE_S (Hydra's proxies then kill the ranks when their mpiexec is gone); `serve` first
    asks rank 0 alone to stop (run_ranks' drain_s), so that its running requests end as they would on one process;
  - the supervisor itself killed with SIGKILL: each rank watches its pid (watch_supervisor) and exits.
Which rank died: Hydra's report names a pid that is not always the dead one, so each rank keeps a connection open
to the supervisor (RankWatch); the kernel closes a dead process's sockets before anyone learns of its death, so the
first connection to close names the rank that died, before Hydra stops the others.
mpiexec runs in a session of its own so that a Ctrl-C on the terminal reaches the supervisor alone, which then
stops the ranks in that order.
"""

from __future__ import annotations

import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from ..core.errors import InputError
from ..models import signals_exit
from .communicator import PARALLEL_EXTRA_HINT

RANKS_ENV = "MINITRANSFORMER_TP_RANKS"           # set in every rank process: its world size
SUPERVISOR_ENV = "MINITRANSFORMER_TP_SUPERVISOR"  # the supervisor's pid, which every rank watches
WATCH_SOCKET_ENV = "MINITRANSFORMER_TP_WATCH"    # the supervisor's Unix socket, which every rank connects to
STOP_GRACE_S = 5.0
WATCH_INTERVAL_S = 0.5
# Hydra's report of a rank that died, printed on mpiexec's stdout; the supervisor prints its own line instead.
HYDRA_BANNER = b"BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES"


def in_rank_process() -> bool:
    """True inside a rank that run_ranks started (the command must then run its part, not launch again)."""
    return RANKS_ENV in os.environ


def find_mpiexec() -> str:
    """The mpiexec of this Python's environment (the mpich wheel puts it next to python), else the PATH's."""
    beside = Path(sys.executable).parent / "mpiexec"
    found = str(beside) if beside.is_file() else shutil.which("mpiexec")
    if found is None:
        raise InputError(f"tensor parallelism starts its ranks with mpiexec, which is not installed; "
                         f"{PARALLEL_EXTRA_HINT}")
    try:
        import mpi4py  # noqa: F401  (only: is it there, before N processes fail to import it)
    except ImportError:
        raise InputError(f"tensor parallelism needs mpi4py; {PARALLEL_EXTRA_HINT}") from None
    return found


def run_ranks(argv: list[str], world_size: int, program: list[str] | None = None,
              drain_s: float | None = None, rank_names: tuple[str, ...] | None = None) -> int:
    """Run `python -m minitransformer *argv` (or `program *argv`: a lesson's own script) as `world_size` ranks;
    return rank 0's exit code, or 1 with one clear line on stderr when a rank died. Stops them all on the way
    out, an exception or a signal included.

    drain_s (serve): a signal first goes to rank 0 alone, as SIGTERM, which then ends the job itself (the server
    drains its requests and tells the workers to stop); only if the job is still there after drain_s, or at a
    second signal, is it stopped as above. A job that ended so returns rank 0's code (0 for a clean drain).
    rank_names: what each rank is, for the line that says one died (default: "tensor-parallel rank N")."""
    program = program if program is not None else [sys.executable, "-m", "minitransformer"]
    command = [find_mpiexec(), "-n", str(world_size), *program, *argv]
    with RankWatch() as watch:
        env = {**os.environ, RANKS_ENV: str(world_size), SUPERVISOR_ENV: str(os.getpid()),
               WATCH_SOCKET_ENV: watch.path}
        # Each rank's BLAS would start one thread per core: N ranks x cores threads that spin while they wait for
        # each other on too few cores, tens of times slower. Give each rank its share of the cores unless told.
        threads = str(max(1, (os.cpu_count() or 1) // world_size))
        for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env.setdefault(name, threads)
        process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   start_new_session=True)
        try:
            with signals_exit():      # SIGTERM / SIGHUP raise SystemExit, so the finally stops the ranks
                try:
                    died = _forward_output(process.stdout)
                except (SystemExit, KeyboardInterrupt):
                    if drain_s is None or not _signal_rank_zero(signal.SIGTERM):
                        raise
                    died = _drain(process, drain_s)
                code = process.wait()
        finally:
            stop(process)
        first_gone = watch.first_gone
    if died or code < 0 or code > 128:
        names = rank_names or tuple(f"tensor-parallel rank {r}" for r in range(world_size))
        what = names[first_gone] if first_gone is not None and first_gone < len(names) \
            else f"one of the {world_size} ranks"
        print(f"minitransformer: error: {what} died (mpiexec exit code {code}); the request ended with an error "
              "and every rank was stopped", file=sys.stderr)
        return 1
    return code


def _drain(process: subprocess.Popen, drain_s: float) -> bool:
    """Rank 0 was asked to stop: go on forwarding the output until the job ends, at most drain_s (then SIGTERM to
    mpiexec, and the caller's stop() makes sure). Returns what _forward_output does."""
    def too_late() -> None:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)

    deadline = threading.Timer(drain_s, too_late)
    deadline.daemon = True
    deadline.start()
    try:
        return _forward_output(process.stdout)
    finally:
        deadline.cancel()


def _signal_rank_zero(signum: int) -> bool:
    """Send `signum` to rank 0 of the job this process supervises (found by the variables every rank carries:
    SUPERVISOR_ENV, and Hydra's PMI_RANK). False when it cannot be found (not Linux, or already gone)."""
    mine = f"{SUPERVISOR_ENV}={os.getpid()}".encode()
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if mine in environ and b"PMI_RANK=0" in environ:
            try:
                os.kill(int(entry.name), signum)
            except OSError:
                return False
            return True
    return False


def _forward_output(pipe) -> bool:
    """Copy the ranks' stdout to ours as it comes (streamed text, or the one JSON object); returns True when
    Hydra reported a dead rank, whose banner and what follows it are not copied. A tail of lines of '=' is held
    back until the next read shows whether the banner follows it (a banner cut across two reads once reached the
    terminal)."""
    out, held = sys.stdout.buffer, b""
    while chunk := os.read(pipe.fileno(), 1 << 16):
        data = held + chunk
        if HYDRA_BANNER in data:
            line = data.rfind(b"\n", 0, data.index(HYDRA_BANNER))      # the banner's line, "=   BAD ..."
            above = data.rfind(b"\n", 0, line) if line > 0 else 0     # the line of '=' above it
            out.write(data[:max(above, 0)])
            out.flush()
            while os.read(pipe.fileno(), 1 << 16):                       # drain mpiexec's epilogue
                pass
            return True
        tail = re.search(rb"(?:(?:^|\n)=[^\n]*)+\n?$", data)     # lines that begin with '=' at the end
        cut = tail.start() if tail else len(data)
        out.write(data[:cut])
        out.flush()
        held = data[cut:]
    out.write(held)
    out.flush()
    return False


class RankWatch:
    """The supervisor's end of the ranks' connections: a Unix socket in a private folder that each rank connects
    to and names itself on (watch_supervisor), and a thread that notes the first rank whose connection closes."""

    def __init__(self):
        self.folder = tempfile.mkdtemp(prefix="minitransformer-ranks-")
        self.path = os.path.join(self.folder, "watch")
        self.first_gone: int | None = None
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(64)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="rank-watch", daemon=True)

    def __enter__(self) -> RankWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        self.thread.join(2)
        self.listener.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    def _run(self) -> None:
        ranks: dict[socket.socket, int | None] = {}       # connection -> the rank it named (None: not yet)
        with selectors.DefaultSelector() as selector:
            selector.register(self.listener, selectors.EVENT_READ)
            while not self.stopping.is_set():
                for key, _ in selector.select(0.1):
                    if key.fileobj is self.listener:
                        accepted, _ = self.listener.accept()
                        ranks[accepted] = None
                        selector.register(accepted, selectors.EVENT_READ, accepted)
                        continue
                    connection: socket.socket = key.data
                    data = connection.recv(64)
                    if data and ranks[connection] is None:
                        named = data.split(b"\n")[0].strip()
                        ranks[connection] = int(named) if named.isdigit() else -1
                    elif not data:                         # the rank is gone
                        rank = ranks[connection]
                        if self.first_gone is None and rank is not None and rank >= 0:
                            self.first_gone = rank
                        selector.unregister(connection)
                        connection.close()
                        del ranks[connection]
        for connection in ranks:
            connection.close()


def stop(process: subprocess.Popen) -> None:
    """SIGTERM to mpiexec (Hydra passes it on to every rank), SIGKILL if it is still there after STOP_GRACE_S."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    if process.stdout is not None:
        process.stdout.close()


def process_gone(pid: int) -> bool:
    """True when `pid` no longer runs: no such process, or a zombie that its parent has not reaped yet (a SIGKILLed
    supervisor whose own parent is still busy; os.kill(pid, 0) succeeds on a zombie, so the ranks once ran on).
    The ranks are mpiexec's children, not the supervisor's, so they cannot watch os.getppid() as replicas do."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state in ("Z", "X")
    except FileNotFoundError:
        return True
    except (OSError, IndexError):                  # no /proc (not Linux): whether the pid exists, as before
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except OSError:
            pass
        return False


_watch_connection: socket.socket | None = None     # held open for the life of the rank (RankWatch)


def watch_supervisor() -> None:
    """In a rank: exit at once if the supervisor that started the job is gone (it was killed with SIGKILL and
    could not stop us). A daemon thread polls its pid; the MPI calls release the GIL while they wait. Also connect
    to the supervisor's RankWatch and name this rank, so that if it dies the supervisor can say which one it was."""
    global _watch_connection
    pid = int(os.environ.get(SUPERVISOR_ENV, "0"))
    if pid <= 0:
        return
    if os.environ.get(WATCH_SOCKET_ENV) and _watch_connection is None:
        try:
            connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            connection.connect(os.environ[WATCH_SOCKET_ENV])
            connection.sendall(f"{os.environ.get('PMI_RANK', '-1')}\n".encode())
            _watch_connection = connection
        except OSError:
            pass                                   # only the death line's wording depends on it

    def watch():
        while not process_gone(pid):
            time.sleep(WATCH_INTERVAL_S)
        os._exit(1)

    threading.Thread(target=watch, name="watch-supervisor", daemon=True).start()
