"""figures/live_page.png: the live page of `minitransformer serve` in the middle of "Send 16 requests".

    python scripts/screenshot_live_page.py [--model PATH] [--out figures/live_page.png] [--size 1280x800]

Starts the server on a free loopback port (default model, a small KV pool and 4 seats, so a queue forms and
requests are preempted), opens the page in the distribution's headless Chromium (apt-get install chromium
chromium-driver), streams one greedy reply, clicks "Send 16 requests", waits until the batch is full and a queue has
formed, focuses a token chip so its tooltip shows, and saves the screenshot. The same page, the same engine: nothing
is drawn for the picture.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path


def start_server(args: list[str]) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen([sys.executable, "-m", "minitransformer", "serve", "--port", "0", *args],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    found = {}
    ready = threading.Event()

    def read():                                     # keep draining the log so the server never blocks on it
        for line in process.stdout:
            match = re.search(r"http://127\.0\.0\.1:\d+", line)
            if match and "url" not in found:
                found["url"] = match.group(0)
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(300) or "url" not in found:
        process.kill()
        sys.exit("the server did not start")
    return process, found["url"]


def browser(width: int, height: int):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver):
        sys.exit("needs chromium and chromedriver: apt-get install chromium chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--hide-scrollbars",
                f"--window-size={width},{height}"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(executable_path=driver), options=options)


def until(driver, expression: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not driver.execute_script("return " + expression):
        if time.monotonic() > deadline:
            driver.save_screenshot("live_page_timeout.png")
            sys.exit(f"the page never showed: {expression} (live_page_timeout.png shows what it did show)")
        time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a GGUF file (default: the default model)")
    parser.add_argument("--out", default="figures/live_page.png")
    parser.add_argument("--size", default="1280x800", help="window WIDTHxHEIGHT (default 1280x800)")
    parser.add_argument("--num-blocks", default="40", help="KV pool of the server (default 40: preemption shows)")
    parser.add_argument("--max-num-seqs", default="4", help="running seats (default 4: a queue forms, as a browser "
                                                            "streams at most 5 requests at once to one server)")
    args = parser.parse_args()
    width, height = (int(x) for x in args.size.split("x"))
    server_args = ["--num-blocks", args.num_blocks, "--max-num-seqs", args.max_num_seqs, "--log-level", "warning"]
    process, url = start_server(server_args + (["--model", args.model] if args.model else []))
    driver = browser(width, height)
    try:
        if width < 500:                             # a phone: headless Chromium's window is never that narrow
            driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                                   {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": True})
        driver.get(url + "/")
        until(driver, "document.getElementById('connection').dataset.state === 'live'", 60)
        driver.execute_script("document.getElementById('max-tokens').value = 24")
        driver.find_element("id", "send").click()
        until(driver, "document.getElementById('reply-status').dataset.state === 'done'", 300)
        driver.find_element("id", "burst").click()
        until(driver, "document.querySelectorAll('#running-list li:not(.empty)').length >= 3 && "
                      "document.querySelectorAll('#waiting-list li:not(.empty)').length >= 1", 300)
        time.sleep(1.0)                             # some steps into the run: tables grown, a timeline drawn
        driver.execute_script("document.querySelectorAll('#chips .chip')[3].focus()")
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(args.out)
        print(f"wrote {args.out}")
    finally:
        driver.quit()
        process.terminate()
        process.wait(30)


if __name__ == "__main__":
    main()
