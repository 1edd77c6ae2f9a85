"""The web console in a real browser: Debian's headless chromium driven by selenium against `blazar serve` with the
real llama-server and the real Gemma 3 270M. The page loads with no console error and no CSP violation; a load from
its Load button shows the instance; a chat made with the openai SDK is followed from the page's request list to its
why timeline, and its events arrive in the live log; pull shows its progress and rm asks first; once a key exists the
page asks for it. Screenshots are kept under $BLAZAR_TEST_ARTIFACTS (default .artifacts/ in the repo).

Also over plain HTTP against the same daemon: the live follow is bounded (MAX_FOLLOWERS) and a stream whose client
went away frees its place."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from blazar.api.console_follow import MAX_FOLLOWERS
from tests.support.daemon import wait_for
from tests.support.serving import blazar_cli, serving_gemma

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[dev]')")
from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(CHROMIUM is None or CHROMEDRIVER is None,
                                reason="Debian's chromium and chromium-driver are not installed "
                                       "(apt-get install chromium chromium-driver; .ci/run installs them)")

MODEL = "gemma"
PULLED = "gemma3-270m"  # the packaged demo model: pulled offline from its python package
ROOT = Path(__file__).resolve().parents[2]
LOAD_S = 180.0


def artifacts() -> Path:
    path = Path(os.environ.get("BLAZAR_TEST_ARTIFACTS") or ROOT / ".artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, engine_binary: Path, gemma_path: Path
           ) -> Iterator[tuple[Path, str]]:
    home = tmp_path_factory.mktemp("console-home")
    settings = {"ctx": 1024, "slots": 2}
    with serving_gemma(home, engine_binary, gemma_path, MODEL, settings) as (port, _proc):
        yield home, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def browser(daemon: tuple[Path, str]) -> Iterator[Any]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1440,2000", "--no-proxy-server", "--disable-extensions"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    try:
        driver.get(f"{daemon[1]}/console")
        yield driver
    finally:
        driver.quit()


def severe(driver: Any) -> list[str]:
    """The browser log's errors since the last call: failed loads, script errors, CSP violations. The page asks for
    /api/blazar/dashboard first and falls back to ps and queue where a daemon does not serve it: that one 404 is
    expected there, and only there."""
    base = driver.current_url.split("/console")[0]
    dashboard = f"{base}/api/blazar/dashboard"
    served = httpx.get(dashboard, timeout=30, trust_env=False).status_code != 404
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"
            and (served or not e["message"].startswith(f"{dashboard} - Failed to load resource"))]


def css(driver: Any, selector: str) -> list[Any]:
    return driver.find_elements(By.CSS_SELECTOR, selector)


def wait_css(driver: Any, selector: str, what: str, timeout: float = 30.0, text: str | None = None) -> Any:
    def found() -> Any:
        try:
            for node in css(driver, selector):
                if text is None or text in node.text:
                    return node
        except StaleElementReferenceException:  # the table was redrawn under us: look again
            return None
        return None
    return wait_for(found, what, timeout=timeout)


def click(driver: Any, selector: str, label: str, what: str, timeout: float = 30.0) -> None:
    """Click the button labelled `label` inside `selector` (retried while the table redraws)."""
    def clicked() -> bool:
        try:
            for row in css(driver, selector):
                for b in row.find_elements(By.TAG_NAME, "button"):
                    if b.text == label:
                        b.click()
                        return True
        except StaleElementReferenceException:
            return False
        return False
    wait_for(clicked, what, timeout=timeout)


def shot(driver: Any, name: str) -> Path:
    path = artifacts() / f"console-{name}.png"
    driver.save_screenshot(str(path))
    assert path.stat().st_size > 10_000
    return path


def test_the_page_loads_with_no_console_error_and_no_csp_violation(browser: Any) -> None:
    wait_css(browser, "#conn.ok", "the page to reach the daemon")
    row = wait_css(browser, f'#models tr[data-model="{MODEL}"]', "the store listing")
    assert "fits" in row.text
    wait_css(browser, "#engine-list tr td.ok", "the active engine", text="active")
    wait_css(browser, '#events tr[data-type="model.imported"]', "the event log")
    assert browser.execute_script("return document.styleSheets.length") == 1  # the stylesheet was not refused
    assert severe(browser) == []


def test_load_from_the_page_shows_the_instance_then_stop_removes_it(browser: Any, daemon: tuple[Path, str]) -> None:
    click(browser, f'#models tr[data-model="{MODEL}"]', "load", "the Load button")
    wait_css(browser, f'#instances tr[data-model="{MODEL}"][data-state="ready"]', "the instance", timeout=LOAD_S)
    r = httpx.get(f"{daemon[1]}/api/blazar/ps", timeout=30, trust_env=False)
    assert [i["model"] for i in r.json()["instances"]] == [MODEL]
    wait_css(browser, '#events tr[data-type="instance.ready"]', "instance.ready in the live log")
    assert severe(browser) == []


def test_a_chat_is_followed_from_the_page_to_its_why_timeline(browser: Any, daemon: tuple[Path, str]) -> None:
    client = openai.OpenAI(base_url=f"{daemon[1]}/v1", api_key="unused", max_retries=0, timeout=120)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hello"}], max_tokens=8)
    trace = raw.headers["x-blazar-trace-id"]
    assert raw.parse().choices[0].message.role == "assistant"
    wait_css(browser, '#events tr[data-type="request.completed"]', "request.completed in the live log", timeout=60)
    click(browser, f'#requests tr[data-trace="{trace}"]', trace[:12], "the request in the page's list", timeout=60)
    wait_css(browser, "#why-steps li[data-type='request.completed']", "the why timeline")
    assert browser.find_element(By.ID, "why-trace").text == trace
    assert browser.find_element(By.ID, "why-verdict").text
    steps = [li.get_attribute("data-type") for li in css(browser, "#why-steps li")]
    assert steps[0] in ("request.received", "instance.starting", "instance.started") and "request.routed" in steps
    # The dashboard route fed the lists: its TTFT in the request's row, its tokens/s in the per-model table.
    def ttft() -> str | None:  # the row is read whole: the table may be redrawn between finding it and its cells
        try:
            rows = css(browser, f'#requests tr[data-trace="{trace}"]')
            text = rows[0].find_elements(By.TAG_NAME, "td")[3].text if rows else ""
        except StaleElementReferenceException:
            return None
        return text if text not in ("", "-") else None

    wait_for(ttft, "the request's row with its TTFT", timeout=60)
    assert "tokens/s over the last" in browser.find_element(By.ID, "dashboard-note").text
    wait_css(browser, "#per-model tr", "the model's row in the per-model table", text=MODEL)
    path = shot(browser, "why")
    assert path.exists()
    assert severe(browser) == []


def test_pin_and_stop_from_the_page(browser: Any, daemon: tuple[Path, str]) -> None:
    row = f'#instances tr[data-model="{MODEL}"]'
    click(browser, row, "pin", "the Pin button")
    wait_css(browser, row, "the pinned instance", text="pinned")
    r = httpx.get(f"{daemon[1]}/api/blazar/ps", timeout=30, trust_env=False)
    assert r.json()["instances"][0]["pinned"] is True
    click(browser, row, "stop", "the Stop button")
    wait_for(lambda: not css(browser, row), "the instance to go", timeout=60)
    assert httpx.get(f"{daemon[1]}/api/blazar/ps", timeout=30, trust_env=False).json()["instances"] == []


def test_pull_shows_its_progress_and_rm_asks_first(browser: Any, daemon: tuple[Path, str]) -> None:
    browser.find_element(By.ID, "pull-input").send_keys(PULLED)
    browser.find_element(By.ID, "pull-go").click()
    wait_css(browser, "#pull-status", "the pull to finish", timeout=120, text=f"pulled {PULLED}")
    bar = browser.find_element(By.ID, "pull-progress")
    assert int(float(bar.get_attribute("max"))) > 100_000_000 and bar.get_attribute("value") == bar.get_attribute("max")
    row = f'#models tr[data-model="{PULLED}"]'
    wait_css(browser, row, "the pulled model in the store")
    click(browser, row, "rm", "the rm button")
    dialog = wait_css(browser, "#confirm[open]", "the confirmation")
    assert PULLED in dialog.text
    browser.find_element(By.ID, "confirm-no").click()  # cancelled: nothing is removed
    assert css(browser, row)
    click(browser, row, "rm", "the rm button")
    wait_css(browser, "#confirm[open]", "the confirmation")
    browser.find_element(By.ID, "confirm-yes").click()
    wait_for(lambda: not css(browser, row), "the model to leave the store", timeout=60)
    wait_css(browser, '#events tr[data-type="model.removed"]', "model.removed in the live log")
    names = [m["name"] for m in httpx.get(f"{daemon[1]}/api/tags", timeout=30, trust_env=False).json()["models"]]
    assert names == [MODEL]
    assert browser.find_element(By.ID, "notice").text == ""  # the rm's bare 200 is no error
    shot(browser, "store")
    assert severe(browser) == []


def test_the_live_follow_is_bounded_and_a_gone_client_frees_its_place(daemon: tuple[Path, str]) -> None:
    url = f"{daemon[1]}/api/blazar/events/follow"
    with contextlib.ExitStack() as stack:
        client = stack.enter_context(httpx.Client(timeout=30, trust_env=False,
                                                  limits=httpx.Limits(max_connections=MAX_FOLLOWERS + 4)))
        refused = None
        for _ in range(MAX_FOLLOWERS + 1):  # the browser holds one already
            r = stack.enter_context(client.stream("GET", url))
            if r.status_code == 503:
                refused = r
                break
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert refused is not None and refused.headers.get("retry-after") == "5"
    # Every stream above was closed by its client: the daemon notices and serves a new one.
    def opens() -> bool:
        with httpx.stream("GET", url, params={"timeout_s": 1}, timeout=30, trust_env=False) as r:
            return r.status_code == 200
    wait_for(opens, "a follow to be served again", timeout=30)
    with httpx.stream("GET", url, params={"timeout_s": 1, "after": 0, "type": "model.imported"}, timeout=30,
                      trust_env=False) as r:
        text = "".join(r.iter_text())
    assert '"type":"model.imported"' in text and "event: end" in text


def test_once_a_key_exists_the_page_asks_for_it_and_works_with_it(browser: Any, daemon: tuple[Path, str]) -> None:
    home, base = daemon
    created = blazar_cli(home, "keys", "create", "console-admin", "--admin", "--json")
    secret = _secret(created)
    browser.refresh()
    wait_css(browser, "#notice", "the page to ask for a key", text="key")
    severe(browser)  # the 401s just logged are the point of this test
    browser.find_element(By.ID, "key-input").send_keys(secret)
    browser.find_element(By.ID, "key-save").click()
    wait_css(browser, "#conn.ok", "the page to work with the key")
    wait_css(browser, f'#models tr[data-model="{MODEL}"]', "the store listing with the key")
    assert browser.execute_script("return sessionStorage.getItem('blazar.console.key')") == secret
    assert httpx.get(f"{base}/api/blazar/models", timeout=30, trust_env=False).status_code == 401


def _secret(created: subprocess.CompletedProcess) -> str:
    import json

    return str(json.loads(created.stdout)["secret"])
