"""The live page (`GET /` of `minitransformer serve`) in a real headless Chromium, and the endpoints it reads.

The browser is the distribution's `chromium`, driven by Selenium through the distribution's `chromedriver` (both
paths given explicitly, so Selenium never looks for or downloads a browser). `.ci/run` installs them; the browser
tests skip, saying so, only where they cannot be found. The HTTP tests below them need no browser.
"""

from __future__ import annotations

import json
import os
import shutil
import threading

import httpx
import pytest

from server_process import running_server

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver") or next(
    (p for p in ("/usr/lib/chromium/chromedriver", "/usr/bin/chromedriver") if os.path.exists(p)), None)
NO_BROWSER = ("the live page's browser tests need chromium and chromedriver from the distribution "
              "(apt-get install chromium chromium-driver; .ci/run installs them), and they are not installed here")

REAL = "SmolLM2-135M-Instruct.Q4_1"
# The real model continues this pattern greedily, so its reply is markup that would run if rendered as HTML.
INJECTION = ('<script>window.pwned=1</script>\n<img src=x onerror="window.pwned=2">\n'
             '<script>window.pwned=1</script>\n<img src=x onerror="window.pwned=2">\n')


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip(NO_BROWSER)
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is in the dev extra: pip install -e .[dev]")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,800", "--no-first-run", "--disable-extensions"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_script_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def tiny_server(tiny_model_path):
    # a small pool and few seats: 16 requests make the engine queue, share prefixes and preempt
    with running_server("--model", str(tiny_model_path), "--num-blocks", "12", "--max-num-seqs", "6",
                        "--log-level", "warning") as server:
        yield server


def js(driver, expression: str):
    return driver.execute_script("return " + expression)


def until(driver, expression: str, timeout_s: float = 60.0):
    """Wait until a JavaScript expression is truthy in the page; its value."""
    from selenium.webdriver.support.ui import WebDriverWait
    return WebDriverWait(driver, timeout_s, poll_frequency=0.05).until(lambda d: js(d, expression),
                                                                      f"the page never satisfied: {expression}")


def open_page(driver, server) -> None:
    """Load the page and wait for its first engine snapshot; then record, every 5 ms, what the panel shows."""
    driver.get(server.url + "/")
    until(driver, "document.getElementById('connection').dataset.state === 'live' && "
                  "document.querySelectorAll('#pool .block').length > 0")
    driver.execute_script("""
        window.seen = {used: 0, running: 0};
        setInterval(() => {
          const used = document.querySelectorAll('#pool .block[data-state=used], #pool .block[data-state=shared]');
          const running = document.querySelectorAll('#running-list li:not(.empty)');
          seen.used = Math.max(seen.used, used.length);
          seen.running = Math.max(seen.running, running.length);
        }, 5);""")


def submit(driver, prompt: str, max_tokens: int, chat: bool = False) -> None:
    driver.execute_script("""
        const [prompt, maxTokens, chat] = arguments;
        document.getElementById('prompt').value = prompt;
        document.getElementById('max-tokens').value = maxTokens;
        document.getElementById('temperature').value = 0;
        document.getElementById('chat').checked = chat;""", prompt, max_tokens, chat)
    driver.find_element("id", "send").click()
    until(driver, "document.getElementById('reply-status').dataset.state === 'done'")


def used_blocks(driver) -> int:
    return js(driver, "document.querySelectorAll('#pool .block[data-state=used], "
                      "#pool .block[data-state=shared]').length")


# ---------------------------------------------------------------------------------------------------- the browser

def test_a_greedy_reply_renders_as_the_api_returns_it_token_by_token(browser, tiny_server):
    body = {"prompt": "the cat sat", "max_tokens": 100, "temperature": 0, "return_token_ids": True}
    api = httpx.post(tiny_server.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]
    open_page(browser, tiny_server)
    submit(browser, "the cat sat", 100)
    assert js(browser, "document.getElementById('reply-text').textContent") == api["text"]
    chips = js(browser, "[...document.querySelectorAll('#chips .chip')].map(c => +c.dataset.tokenId)")
    assert chips == api["token_ids"]                                  # one chip per completion token, in order
    assert js(browser, "document.querySelectorAll('#chips .chip.ttft').length") == 1
    assert js(browser, "document.querySelector('#chips .chip').classList.contains('ttft')")
    assert js(browser, "seen.used") > 0                               # the grid showed the request's blocks ...
    until(browser, "document.querySelectorAll('#pool .block[data-state=used], "
                   "#pool .block[data-state=shared]').length === 0", 10)   # ... and none once it finished
    # keyboard: Tab-focusing a chip shows its id, logprob and alternatives
    browser.execute_script("document.querySelectorAll('#chips .chip')[1].focus()")
    tip = js(browser, "document.getElementById('tooltip').hidden ? null : "
                      "document.getElementById('tooltip').textContent")
    assert tip and f"id {api['token_ids'][1]}" in tip and "logprob" in tip and "top alternatives" in tip


def test_send_16_requests_shows_continuous_batching(browser, tiny_server):
    open_page(browser, tiny_server)
    browser.find_element("id", "burst").click()
    until(browser, "/16 requests: 0 waiting.* 0 streaming, \\d+ done/.test("
                   "document.getElementById('burst-status').textContent)", 120)
    status = js(browser, "document.getElementById('burst-status').textContent")
    assert "16 done" in status, status
    assert js(browser, "seen.running") > 1                            # several sequences in the batch at once
    assert js(browser, "+document.getElementById('c-peak').textContent") > 1
    until(browser, "document.querySelectorAll('#running-list li:not(.empty)').length === 0", 10)
    assert used_blocks(browser) == 0


def test_a_reply_that_is_markup_shows_as_text_and_runs_nothing(browser, real_model_path):
    with running_server("--model", str(real_model_path), "--num-blocks", "32", "--log-level", "warning") as server:
        body = {"prompt": INJECTION, "max_tokens": 24, "temperature": 0}
        api = httpx.post(server.url + "/v1/completions", json=body, timeout=120).json()["choices"][0]["text"]
        assert "<script>" in api and "onerror" in api, api                 # the premise: the reply is markup
        open_page(browser, server)
        submit(browser, INJECTION, 24)
        assert js(browser, "document.getElementById('reply-text').textContent") == api
    assert js(browser, "document.querySelectorAll('#reply-text *, #chips .chip *').length") == 0
    assert js(browser, "typeof window.pwned") == "undefined"               # neither the script nor onerror ran
    from selenium.common.exceptions import NoAlertPresentException
    with pytest.raises(NoAlertPresentException):
        _ = browser.switch_to.alert.text                                   # reading the alert raises when none is open


# ---------------------------------------------------------------------------------------------------- HTTP only

def events(url: str, count: int, headers: dict | None = None) -> list[dict]:
    """The first `count` snapshots of /v1/engine/events."""
    out = []
    with httpx.stream("GET", url + "/v1/engine/events", headers=headers, timeout=30) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                out.append(json.loads(line[6:]))
                if len(out) == count:
                    break
    return out


def test_the_page_and_its_files_are_served_with_a_strict_policy(tiny_server):
    page = httpx.get(tiny_server.url + "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    for name, kind in (("page.js", "text/javascript"), ("page.css", "text/css")):
        asset = httpx.get(f"{tiny_server.url}/static/{name}")
        assert asset.status_code == 200 and asset.headers["content-type"].startswith(kind)
    assert httpx.get(tiny_server.url + "/static/..%2Fapp.py").status_code == 404
    assert "innerHTML" not in httpx.get(tiny_server.url + "/static/page.js").text


def test_engine_events_show_a_running_request_its_blocks_and_then_the_pool_free(tiny_server):
    body = {"prompt": "the cat sat on the mat", "max_tokens": 90, "temperature": 0, "ignore_eos": True}
    seen = []
    with httpx.stream("GET", tiny_server.url + "/v1/engine/events", timeout=60) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = (json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: "))
        seen.append(next(events))                                     # subscribed first: every step is watched
        for _ in range(5):          # the tiny model may finish between two events (20 a second): then once more
            latest = seen[-1]["finished"][0]["id"] if seen[-1]["finished"] else None
            request = threading.Thread(target=lambda: httpx.post(tiny_server.url + "/v1/completions", json=body,
                                                                 timeout=60))
            request.start()
            for event in events:                                      # until it shows among the finished
                seen.append(event)
                if event["finished"] and event["finished"][0]["id"] != latest and not event["running"]:
                    break
            request.join()
            if any(e["running"] for e in seen):
                break
    first = seen[0]
    assert first["config"]["num_blocks"] == len(first["pool"]) == 12 and first["running"] == []
    during = next(e for e in seen if e["running"])
    seq = during["running"][0]
    assert seq["prompt_tokens"] > 0 and seq["blocks"] and seq["status"] == "running"
    assert all(during["pool"][b] in "us" for b in seq["blocks"])
    assert during["steps"] and {"prefill_tokens", "decode_tokens", "duration_s"} <= set(during["steps"][-1])
    after = seen[-1]
    assert after["running"] == [] and set(after["pool"]) <= {".", "c"}
    done = after["finished"][0]                                       # the latest first
    assert done["id"] == seq["id"] and done["output_tokens"] == 90 and done["ttft_s"] > 0


def test_return_token_ids_streamed_and_whole_match(tiny_server, tiny_model):
    body = {"prompt": "the dog", "max_tokens": 7, "temperature": 0, "return_token_ids": True}
    whole = httpx.post(tiny_server.url + "/v1/completions", json=body).json()["choices"][0]
    with httpx.stream("POST", tiny_server.url + "/v1/completions", json={**body, "stream": True}) as response:
        chunks = [json.loads(line[6:]) for line in response.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    streamed = [i for c in chunks for i in c["choices"][0]["token_ids"]]
    assert streamed == whole["token_ids"] and len(streamed) == 7
    assert tiny_model.tokenizer.decode(streamed) == whole["text"]


def test_another_tenants_request_shows_as_anonymous_occupancy(browser, real_model_path, tmp_path):
    """With --api-keys the page shows the key's own requests and, for another tenant's, only that one is there."""
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"sk-alice": {"tenant": "alice"}, "sk-bob": {"tenant": "bob"}}))
    body = {"prompt": "Write a long story.", "max_tokens": 2000, "ignore_eos": True, "stream": True}
    with running_server("--model", str(real_model_path), "--api-keys", str(keys), "--num-blocks", "256",
                        "--log-level", "warning") as server, httpx.Client(
            timeout=120, headers={"Authorization": "Bearer sk-bob"}) as http, http.stream(
            "POST", server.url + "/v1/completions", json=body) as running:
        lines = running.iter_lines()                  # kept: a dropped iterator closes the connection (an abort)
        next(line for line in lines if line.startswith("data: "))
        browser.get(server.url + "/")
        until(browser, "!document.getElementById('key-row').hidden")
        browser.execute_script("""const key = document.getElementById('api-key');
                                  key.value = 'sk-alice'; key.dispatchEvent(new Event('change'));""")
        until(browser, "document.querySelector('#running-list li.other') !== null")
        text = js(browser, "document.getElementById('running-list').textContent")
    assert "another tenant's request" in text and "blocks" in text
    assert js(browser, "document.querySelectorAll('#tables .row').length") == 0    # its block table stays hidden


def test_with_api_keys_the_events_need_the_key(tiny_model_path, tmp_path):
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"sk-live": {"tenant": "page"}}))
    with running_server("--model", str(tiny_model_path), "--api-keys", str(keys), "--log-level", "warning") as server:
        assert httpx.get(server.url + "/").status_code == 200             # the page itself holds no secret
        refused = httpx.get(server.url + "/v1/engine/events")
        assert refused.status_code == 401 and "API key" in refused.json()["error"]["message"]
        assert events(server.url, 1, {"Authorization": "Bearer sk-live"})[0]["pool"]
