"""The page ds4server serves at / and /dashboard, driven in Debian's headless
Chromium by Playwright against real servers (tests/browser/run.sh starts
them): a streamed answer, stop, regenerate, edit and resend (warm), seed
replay, the dashboard updating, the API-key prompt, the too-long and busy
messages, a phone viewport, and no console errors. Screenshots of each state
go to $DS4_BROWSER_SCREENSHOTS (default: a new temp dir)."""

import json
import os
import re
import shutil
import sys
import tempfile
import time
import traceback
import urllib.request

from playwright.sync_api import sync_playwright

BASE = os.environ.get("DS4_BROWSER_BASE", "http://127.0.0.1:8000")
KEY_BASE = os.environ.get("DS4_BROWSER_KEY_BASE")
KEY = os.environ.get("DS4_BROWSER_KEY", "")
SHOTS = os.environ.get("DS4_BROWSER_SCREENSHOTS") or tempfile.mkdtemp(prefix="ds4-browser-")
os.makedirs(SHOTS, exist_ok=True)
CHROMIUM = os.environ.get("DS4_CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TIMEOUT_MS = 60_000


class Browser:
    """A fresh Chromium profile; collects console errors and page errors."""

    def __init__(self, pw, **context_options):
        self.profile = tempfile.mkdtemp(prefix="ds4-chromium-")
        self.context = pw.chromium.launch_persistent_context(
            self.profile,
            executable_path=CHROMIUM,
            headless=True,
            args=ARGS,
            **context_options,
        )
        self.context.set_default_timeout(TIMEOUT_MS)
        self.page = self.context.pages[0] if self.context.pages else self.context.new_page()
        self.errors = []
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))

    def close(self):
        self.context.close()
        shutil.rmtree(self.profile, ignore_errors=True)

    def shot(self, name):
        path = os.path.join(SHOTS, f"{name}.png")
        self.page.screenshot(path=path, full_page=False)
        return path


# ------------------------------------------------------------------ helpers


def set_field(page, id_, value):
    page.evaluate("() => { const s = document.getElementById('settings'); s.open = true; }")
    page.fill(f"#{id_}", str(value))
    page.dispatch_event(f"#{id_}", "change")


def send(page, text):
    page.fill("#input", text)
    page.press("#input", "Enter")


def last_reply(page):
    return page.locator("article.msg.assistant").last


def wait_done(page):
    """Wait for the reply to finish streaming; returns its text and stats."""
    page.wait_for_function("() => !window.ds4.busy()", timeout=TIMEOUT_MS)
    reply = last_reply(page)
    return reply.locator(".body").inner_text(), stats(reply)


def stats(reply):
    out = {}
    spans = reply.locator(".stats [data-stat]")
    for i in range(spans.count()):
        s = spans.nth(i)
        out[s.get_attribute("data-stat")] = s.inner_text()
    seed = reply.locator(".seed-btn")
    if seed.count():
        out["seed"] = seed.get_attribute("data-seed")
    return out


def number(text):
    return int(re.sub(r"[^\d]", "", text.split()[0]))


def wait_queue(base, ready, timeout=30):
    """Poll the server's /v1/status until ready(status)."""
    deadline = time.time() + timeout
    while True:
        req = urllib.request.Request(base + "/v1/status", headers={"Authorization": f"Bearer {KEY}"})
        with urllib.request.urlopen(req, timeout=5) as r:
            status = json.load(r)
        if ready(status):
            return status
        if time.time() > deadline:
            raise AssertionError(f"the server did not get there: {status}")
        time.sleep(0.05)


def open_page(b, base=BASE):
    b.page.goto(base + "/")
    b.page.wait_for_function("() => document.getElementById('model').textContent.length > 0")


# -------------------------------------------------------------------- tests


def test_streamed_answer(b):
    page = b.page
    open_page(b)
    assert page.evaluate("document.activeElement.id") == "input", "the message box has focus"
    set_field(page, "max_tokens", 48)
    send(page, "Write a short poem about the sea.")
    # Streaming: the reply grows while the Stop button is up.
    page.wait_for_selector("#stop:not([hidden])")
    lengths = []
    deadline = time.time() + 60
    while page.evaluate("window.ds4.busy()") and time.time() < deadline:
        lengths.append(len(last_reply(page).locator(".body").inner_text()))
        time.sleep(0.05)
    partial = sorted({n for n in lengths if n > 1})
    assert len(partial) >= 2, f"the reply did not grow while streaming: {lengths}"
    text, st = wait_done(page)
    assert text.strip(), "empty answer"
    assert number(st["tokens"]) >= 1 and "ttft" in st and "tps" in st, st
    assert "cached" in st and "seed" in st, st
    assert page.is_hidden("#stop") and page.is_visible("#send")
    # Kept in the browser's storage.
    saved = page.evaluate("JSON.parse(localStorage.getItem('ds4.conversations'))")
    assert saved[0]["messages"][1]["content"] == page.evaluate(
        "window.ds4.conversations()[0].messages[1].content"
    )
    b.shot("01-streamed-answer")
    copy = last_reply(page).locator(".copy-btn")
    copy.click()
    page.wait_for_function("() => [...document.querySelectorAll('.copy-btn')].some(b => b.textContent === 'Copied')")


def test_stop_mid_answer(b):
    page = b.page
    set_field(page, "max_tokens", 400)
    send(page, "Tell me a long story about a lighthouse keeper.")
    page.wait_for_function(
        "() => { const m = window.ds4.conversations()[0].messages; return m[m.length-1].content.length > 5; }"
    )
    page.keyboard.press("Escape")
    text, st = wait_done(page)
    assert "stopped" in st, st
    assert text.strip(), "the partial answer is kept"
    b.shot("02-stopped")
    # The server is free again and the partial reply can be regenerated.
    set_field(page, "max_tokens", 24)


def test_regenerate(b):
    page = b.page
    set_field(page, "max_tokens", 24)
    set_field(page, "temperature", 1.0)
    before = len(page.locator("article.msg").all())
    last_reply(page).locator(".regen-btn").click()
    page.wait_for_selector("#stop:not([hidden])")
    text, st = wait_done(page)
    assert text.strip() and "stopped" not in st, st
    assert len(page.locator("article.msg").all()) == before, "replaced, not appended"
    b.shot("03-regenerated")


def test_edit_earlier_message_is_warm(b):
    page = b.page
    page.click("#new-chat")
    set_field(page, "max_tokens", 16)
    send(page, "Name three colors.")
    wait_done(page)
    send(page, "Now name three animals.")
    wait_done(page)
    users = page.locator("article.msg.user")
    assert users.count() == 2
    users.nth(1).locator(".edit-btn").click()
    box = page.locator("article.msg.user .edit textarea")
    box.fill("Now name three fruits.")
    box.press("Enter")
    text, st = wait_done(page)
    assert text.strip()
    assert page.locator("article.msg").count() == 4, "the later reply was replaced"
    assert page.locator("article.msg.user").nth(1).inner_text().find("fruits") >= 0
    cached = number(st["cached"])
    assert cached > 0, f"the edited turn started cold: {st}"
    b.shot("04-edited-warm")


def test_seed_replay(b):
    page = b.page
    page.click("#new-chat")
    set_field(page, "max_tokens", 24)
    set_field(page, "temperature", 1.0)
    send(page, "Invent a name for a cat.")
    first, st = wait_done(page)
    seed = st["seed"]
    # Another draw first, so a replay that ignored the seed would show.
    last_reply(page).locator(".regen-btn").click()
    page.wait_for_function("() => window.ds4.busy()")
    other, st2 = wait_done(page)
    assert st2["seed"] != seed, (seed, st2)
    # Replay the first answer's seed.
    set_field(page, "seed", seed)
    last_reply(page).locator(".regen-btn").click()
    page.wait_for_function("() => window.ds4.busy()")
    again, st3 = wait_done(page)
    assert st3["seed"] == seed, (seed, st3)
    assert again == first, f"replay differs:\n{first!r}\n{again!r}"
    set_field(page, "seed", "")
    # The seed link itself replays the answer it is on.
    last_reply(page).locator(".seed-btn").click()
    page.wait_for_function("() => window.ds4.busy()")
    clicked, st4 = wait_done(page)
    assert st4["seed"] == seed and clicked == first, (st4, clicked)
    b.shot("05-seed-replayed")


def test_dashboard_updates(b):
    page = b.page
    page.click("#tab-dashboard")
    assert page.url.endswith("/dashboard")
    page.wait_for_selector("dd[data-k=turns]")
    turns = number(page.inner_text("dd[data-k=turns]"))
    assert page.inner_text("dd[data-k=sampling_law]") == "nucleus"
    assert page.inner_text("dd[data-k=model]") == "smollm2"
    live_before = page.inner_text("dd[data-k=live_tokens]")
    b.shot("06-dashboard-before")
    page.click("#tab-chat")
    send(page, "One more question: what is two plus two?")
    wait_done(page)
    page.click("#tab-dashboard")
    page.wait_for_function(
        f"() => parseInt(document.querySelector('dd[data-k=turns]').textContent.replace(/,/g, '')) === {turns + 1}"
    )
    assert page.inner_text("dd[data-k=live_tokens]") != live_before
    assert number(page.inner_text("dd[data-k=hits_live]")) >= 1, "earlier warm turns"
    assert "tok/s" in page.inner_text("dd[data-k=last_decode]")
    assert page.locator("#chart-decode polyline").count() == 1
    b.shot("07-dashboard-after")
    # Loaded directly, /dashboard opens on the dashboard.
    page.goto(BASE + "/dashboard")
    page.wait_for_selector("dd[data-k=turns]")
    assert page.is_hidden("#view-chat")
    page.click("#tab-chat")


def test_stored_reasoning_and_tool_calls(b):
    """A stored conversation with reasoning and a tool call renders them:
    the reasoning folded, the call as a call (the default model makes
    neither, so the conversation is written to storage and reloaded)."""
    page = b.page
    if not page.url.startswith(BASE):
        open_page(b)
    page.evaluate(
        """() => {
          const convs = JSON.parse(localStorage.getItem('ds4.conversations')) || [];
          convs.unshift({id: 'stored', title: 'Stored', messages: [
            {role: 'user', content: 'Weather in Paris?'},
            {role: 'assistant', content: 'Let me check.', reasoning: 'The user wants <b>weather</b>.',
             tool_calls: [{id: 'call_1', type: 'function', function: {name: 'get_weather', arguments: '{"city":"Paris"}'}}],
             stats: {completion_tokens: 9, prompt_tokens: 20, cached_tokens: 0, seed: 5, ttft_ms: 10, tps: 50}}]});
          localStorage.setItem('ds4.conversations', JSON.stringify(convs));
          localStorage.setItem('ds4.current', JSON.stringify('stored'));
        }"""
    )
    page.reload()
    reply = last_reply(page)
    details = reply.locator("details.reasoning")
    assert details.count() == 1 and details.get_attribute("open") is None, "reasoning folded"
    assert not reply.locator(".thinking").is_visible()
    details.locator("summary").click()
    assert reply.locator(".thinking").inner_text() == "The user wants <b>weather</b>."
    assert reply.locator(".tool").inner_text() == 'tool call → get_weather({"city":"Paris"})'
    assert reply.locator(".seed-btn").get_attribute("data-seed") == "5"
    b.shot("08-reasoning-and-tool-call")


def test_no_console_errors(b):
    assert not b.errors, b.errors


def test_api_key_prompt(pw):
    assert KEY_BASE, "DS4_BROWSER_KEY_BASE is not set"
    b = Browser(pw)
    try:
        page = b.page
        page.goto(KEY_BASE + "/")
        page.wait_for_selector("#key-dialog[open]")
        b.shot("09-api-key-prompt")
        page.fill("#key-input", KEY)
        page.click("#key-ok")
        page.wait_for_function("() => document.getElementById('model').textContent.length > 0")
        assert page.evaluate("localStorage.getItem('ds4.apiKey')") == f'"{KEY}"'
        set_field(page, "max_tokens", 12)
        send(page, "Hello!")
        text, st = wait_done(page)
        assert text.strip() and "tokens" in st, st

        # Too long for this server's --ctx 2048: a clear message.
        send(page, "Please summarise: " + "the quick brown fox jumps over the lazy dog " * 250)
        page.wait_for_selector("#notice:not([hidden])")
        assert "context" in page.inner_text("#notice"), page.inner_text("#notice")
        b.shot("10-too-long")

        # Busy: one turn running and one waiting (the queue holds one at
        # --max-queue 0), then one from the page. The background turns carry
        # a long prompt: its prefill keeps the worker busy for seconds.
        page.evaluate(
            """key => { window.__startBg = () => { fetch('/v1/chat/completions', {method: 'POST',
                 headers: {'Content-Type': 'application/json', 'Authorization': 'Bearer ' + key},
                 body: JSON.stringify({messages: [{role: 'user', content: 'apple banana cherry '.repeat(250)}],
                                       max_tokens: 4, stream: true})})
                 .then(r => r.text()).catch(() => {}); }; }""",
            KEY,
        )
        before = wait_queue(KEY_BASE, lambda s: True)["totals"]["requests"]
        page.evaluate("() => window.__startBg()")
        # Taken by the worker: counted, and the queue empty again.
        wait_queue(KEY_BASE, lambda s: s["totals"]["requests"] > before and s["queue_depth"] == 0)
        page.evaluate("() => window.__startBg()")
        wait_queue(KEY_BASE, lambda s: s["queue_depth"] == 1)
        page.click("#new-chat")  # the long message stays in the old one
        send(page, "Are you there?")
        page.wait_for_function("() => /at capacity/.test(document.getElementById('notice').textContent)")
        b.shot("11-busy")
        # Only the refusals this test asked for reached the console.
        unexpected = [
            e
            for e in b.errors
            if not re.search(r"status of (401|400|503)", e)
        ]
        assert not unexpected, unexpected
    except Exception:
        b.shot("fail-test_api_key_prompt-keyed")
        raise
    finally:
        b.close()


def test_phone_viewport(pw):
    b = Browser(pw, viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True, has_touch=True)
    try:
        page = b.page
        open_page(b)
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, f"the page is {width}px wide at a 390px viewport"
        assert page.is_visible("#menu")
        box = page.locator("#side").bounding_box()
        assert box["x"] + box["width"] <= 1, f"the side panel covers the chat: {box}"
        composer = page.locator("#composer").bounding_box()
        assert composer["y"] + composer["height"] <= 844 and composer["width"] <= 390, composer
        set_field(page, "max_tokens", 16)
        page.click("#menu")  # settings live in the side panel
        page.wait_for_function("() => document.getElementById('side').getBoundingClientRect().x >= 0")
        b.shot("12-phone-menu")
        page.click("#menu")
        send(page, "Say hello in French, with a code block of Python printing it.")
        text, st = wait_done(page)
        assert text.strip() and "tokens" in st, st
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        b.shot("13-phone-chat")
        page.click("#tab-dashboard")
        page.wait_for_selector("dd[data-k=turns]")
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        b.shot("14-phone-dashboard")
        assert not b.errors, b.errors
    finally:
        b.close()


def test_markdown_is_escaped(b):
    """The renderer (in the page) makes markup only from markdown."""
    page = b.page
    html = page.evaluate(
        "() => { const d = document.createElement('div');"
        " d.innerHTML = renderMarkdown('**bold** <img src=x onerror=alert(1)>\\n\\n```py\\nprint(\"<b>\")\\n```\\n- `a<b`');"
        " return d.innerHTML; }"
    )
    assert "<strong>bold</strong>" in html, html
    assert "<img" not in html and "&lt;img" in html, html
    assert '<pre data-lang="py"><code>print("&lt;b&gt;")</code></pre>' in html, html
    assert "<li><code>a&lt;b</code></li>" in html, html


def main():
    passed = failed = 0
    with sync_playwright() as pw:
        b = Browser(pw)
        tests = [
            (test_streamed_answer, b),
            (test_stop_mid_answer, b),
            (test_regenerate, b),
            (test_edit_earlier_message_is_warm, b),
            (test_seed_replay, b),
            (test_dashboard_updates, b),
            (test_markdown_is_escaped, b),
            (test_stored_reasoning_and_tool_calls, b),
            (test_no_console_errors, b),
            (test_api_key_prompt, pw),
            (test_phone_viewport, pw),
        ]
        only = os.environ.get("DS4_BROWSER_ONLY")
        for test, arg in tests:
            if only and only not in test.__name__:
                continue
            start = time.time()
            try:
                test(arg)
                passed += 1
                print(f"PASS {test.__name__} ({time.time() - start:.1f}s)")
            except Exception:  # noqa: BLE001 - report every failure and go on
                failed += 1
                print(f"FAIL {test.__name__}")
                traceback.print_exc()
                try:
                    b.shot(f"fail-{test.__name__}")
                except Exception:  # noqa: BLE001
                    pass
        b.close()
    print(f"screenshots: {SHOTS}")
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
