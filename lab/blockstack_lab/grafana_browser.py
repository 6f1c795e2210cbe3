"""The dashboard in a real browser: Debian's chromium driven by playwright's Python package (no
browser download: executable_path is /usr/bin/chromium). Used by the browser and API tests
(dashboards/tests/test_grafana.py), `make dashboard-screenshot` and the load-time benchmark.

Elements are found by Grafana's own test ids (@grafana/e2e-selectors, rendered as data-testid or
aria-label attributes), as Grafana's e2e-playwright suite does:
  panel:            data-testid="data-testid Panel header TITLE"   (components.Panels.Panel.title)
  loading:          aria-label="Panel loading bar"                 (components.Panels.Panel.loadingBar)
  error:            data-testid="data-testid Panel status error"   (components.Panels.Panel.status('error'))
  "No data":        data-testid="data-testid Panel data error message" (components.Panels.Panel.PanelDataErrorMessage)
  annotation:       data-testid="data-testid annotation-marker"    (pages.Dashboard.Annotations.marker)
  login:            data-testid Username input field / Password input field / Login button
  variables:        data-testid template variable, ... submenu Label LABEL, ... Variable Value DropDown
                    value link text VALUE (pages.Dashboard.SubMenu); its options: data-testid Select option
                    (components.Select.option)
"""

import contextlib
import json
import re
import tempfile
import time
import urllib.parse

CHROMIUM = "/usr/bin/chromium"
# Headless, and nothing of chromium's own that would call out (component updates, sync, field trials).
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
PANEL = '[data-testid^="data-testid Panel header "]'
PANEL_PREFIX = "data-testid Panel header "
LOADING = '[aria-label="Panel loading bar"]'
ERROR = '[data-testid="data-testid Panel status error"]'
NO_DATA = '[data-testid="data-testid Panel data error message"]'
VALUE = '[data-testid^="data-testid Dashboard template variables Variable Value DropDown value link text"]'
ANNOTATION = '[data-testid="data-testid annotation-marker"]'


class Browser:
    """One chromium with a fresh profile; every request and websocket the page opens is recorded,
    and every /api/ds/query request with its body, status, timing and response."""

    def __init__(self, base_url, password, viewport=(1600, 1000)):
        self.base_url, self.password, self.viewport = base_url.rstrip("/"), password, viewport
        self.requests = []  # every URL the page asked for (documents, scripts, XHR, fonts, websockets)
        self.queries = []  # /api/ds/query: {"body", "status", "response", "ms", "done"}
        self.failed = []  # (url, HTTP status or failure text) of every request that failed
        # requests to other hosts that Grafana's Content-Security-Policy (deploy/, grafana.ini)
        # stopped in the page, never sent. Grafana 12.4 itself makes one now and then: its
        # BackendSrv loads FingerprintJS for a device ID on every page load, and FingerprintJS 3
        # asks https://m1.openfpcdn.io/.../npm-monitoring on 1 load in 1,000 (Math.random() <
        # 0.001), which broke a fresh CI run (2026-11-29). Not a failure of the page: the CSP's work.
        self.blocked = []
        self._stack = contextlib.ExitStack()

    def __enter__(self):
        from playwright.sync_api import sync_playwright

        pw = self._stack.enter_context(sync_playwright())
        profile = self._stack.enter_context(
            tempfile.TemporaryDirectory(prefix="blockstack-chromium-")
        )
        self.context = pw.chromium.launch_persistent_context(
            profile,
            executable_path=CHROMIUM,
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": self.viewport[0], "height": self.viewport[1]},
        )
        self._stack.callback(self.context.close)
        self.page = self.context.pages[0] if self.context.pages else self.context.new_page()
        self.page.set_default_timeout(60_000)
        self.page.on("request", self._on_request)
        self.page.on("requestfinished", self._on_finished)
        self.page.on("requestfailed", self._on_finished)
        self.page.on("websocket", lambda ws: self.requests.append(ws.url))
        return self

    def __exit__(self, *exc):
        return self._stack.__exit__(*exc)

    # -- recording --------------------------------------------------------------------------
    def _on_request(self, request):
        self.requests.append(request.url)
        if "/api/ds/query" in request.url and request.method == "POST":
            self.queries.append(
                {
                    "request": request,
                    "body": json.loads(request.post_data or "{}"),
                    "done": False,
                    "started": time.monotonic(),
                }
            )

    def _on_finished(self, request):
        response = request.response() if request.failure is None else None
        if request.failure == "net::ERR_ABORTED":
            pass  # cancelled by the page itself (Grafana cancels a panel's queries when a variable changes)
        elif (
            request.failure == "csp" and urllib.parse.urlsplit(request.url).hostname != "127.0.0.1"
        ):
            self.blocked.append(request.url)
        elif request.failure is not None or response is None or response.status >= 400:
            self.failed.append(
                (request.url, request.failure or (response.status if response else "no response"))
            )
        for q in self.queries:
            if q["request"] is request:
                q["done"] = True
                response = request.response()
                q["status"] = response.status if response else None
                try:
                    q["response"] = response.json() if response else None
                except Exception:  # a cancelled or non-JSON answer: the status says it
                    q["response"] = None
                timing = request.timing
                q["ms"] = (
                    timing["responseEnd"] - timing["requestStart"]
                    if timing["responseEnd"] > 0
                    else None
                )

    def in_flight(self):
        return sum(not q["done"] for q in self.queries)

    def foreign_requests(self):
        """Requests sent to any host but 127.0.0.1 (data: and blob: URLs stay in the page; the
        ones the CSP stopped were never sent: `blocked`)."""
        return [
            u
            for u in self.requests
            if urllib.parse.urlsplit(u).scheme not in ("data", "blob")
            and urllib.parse.urlsplit(u).hostname != "127.0.0.1"
            and u not in self.blocked
        ]

    # -- Grafana ----------------------------------------------------------------------------
    def login(self):
        page = self.page
        page.goto(self.base_url + "/login")
        page.get_by_test_id("data-testid Username input field").fill("admin")
        page.get_by_test_id("data-testid Password input field").fill(self.password)
        page.get_by_test_id("data-testid Login button").click()
        page.wait_for_url(lambda url: "/login" not in url, timeout=60_000)

    def open_dashboard(self, uid, params):
        """Open /d/UID?params; returns time.monotonic() at the start of the navigation."""
        started = time.monotonic()
        self.page.goto(f"{self.base_url}/d/{uid}?{urllib.parse.urlencode(params, doseq=True)}")
        self.page.locator(PANEL).first.wait_for()
        return started

    def load_every_panel(self, timeout=120):
        """Scroll each panel into view (Grafana queries a panel only once it is in view) and wait until
        it has finished loading, down to the last panel. Returns {title: state} in page order, state
        being {"error": text or None, "no_data": text or None, "loaded_at": time.monotonic()}."""
        page = self.page
        deadline = time.monotonic() + timeout
        states = {}
        while time.monotonic() < deadline:
            titles = [
                t[len(PANEL_PREFIX) :]
                for t in page.locator(PANEL).evaluate_all(
                    "els => els.map(e => e.getAttribute('data-testid'))"
                )
            ]
            pending = [t for t in titles if t not in states]
            if not pending:
                break
            for title in pending:
                panel = self.panel(title)
                panel.scroll_into_view_if_needed()
                loaded_at = self.wait_loaded(panel, deadline)
                states[title] = {
                    "error": _text(panel.locator(ERROR)),
                    "no_data": _text(panel.locator(NO_DATA)),
                    "loaded_at": loaded_at,
                }
            page.mouse.wheel(
                0, self.viewport[1]
            )  # further rows may appear below the last panel seen
        else:
            raise TimeoutError(
                f"panels still loading after {timeout}s: {sorted(set(titles) - set(states))}"
            )
        return states

    def wait_loaded(self, panel, deadline):
        """Until the panel shows no loading bar and no query of the page is in flight, 0.5 s in a row;
        returns when that quiet began (time.monotonic())."""
        quiet_since = None
        while time.monotonic() < deadline:
            busy = panel.locator(LOADING).count() > 0 or self.in_flight() > 0
            if busy:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since >= 0.5:
                return quiet_since
            time.sleep(0.1)
        raise TimeoutError(f"panel still loading: {panel}")

    def choose_variable(self, label, value):
        """Pick value in the dashboard's variable picker labelled label, as a user does; fails with
        the options offered (and the page's failed requests) when value is not among them."""
        page = self.page
        self._picker(label).locator(VALUE).first.click()
        options = page.get_by_test_id("data-testid Select option")
        try:
            options.first.wait_for(timeout=30_000)
        except Exception:
            pass  # no options at all: said below
        offered = [t.strip() for t in options.all_inner_texts()]
        if value not in offered:
            raise AssertionError(
                f"variable {label!r}: {value} not among the options {offered}; "
                f"failed requests of the page: {self.failed}"
            )
        options.filter(has_text=re.compile(f"^{re.escape(value)}$")).click()
        page.keyboard.press("Escape")

    def variable_value(self, label):
        testid = self._picker(label).locator(VALUE).first.get_attribute("data-testid")
        return testid.rsplit(" ", 1)[1]

    def _picker(self, label):
        return self.page.get_by_test_id("data-testid template variable").filter(
            has=self.page.get_by_test_id(
                f"data-testid Dashboard template variables submenu Label {label}"
            )
        )

    def screenshot(self, path):
        """The whole dashboard as a reader sees it, into the PNG `path`: the viewport made as tall as the
        page, so that every panel is in view and drawn (Grafana scrolls an inner container; a
        full-page capture of the usual viewport leaves virtualised tables outside it blank)."""
        height = self.page.evaluate(
            "() => Math.max(...Array.from(document.querySelectorAll('*'), e => e.scrollHeight))"
        )
        self.page.set_viewport_size({"width": self.viewport[0], "height": height + 100})
        try:
            self.page.mouse.wheel(0, -height)
            self.page.wait_for_timeout(3000)
            self.page.screenshot(path=path)
        finally:
            self.page.set_viewport_size({"width": self.viewport[0], "height": self.viewport[1]})

    def panel(self, title):
        return self.page.locator(f'[data-testid="{PANEL_PREFIX}{title}"]')

    def legend(self, title):
        """{series name: [cell texts]} of a time series panel's table legend (Name, Mean, Max, Last *)."""
        rows = (
            self.panel(title)
            .locator("table tbody tr")
            .evaluate_all(
                "rows => rows.map(r => [r.querySelector('button') ? r.querySelector('button').title : '',"
                " ...Array.from(r.querySelectorAll('td')).slice(1).map(td => td.textContent)])"
            )
        )
        return {r[0].strip(): r[1:] for r in rows if r[0]}

    def legend_hidden(self, title):
        """The series names of a time series panel's legend rows a reader cannot see: outside the box of
        a scrolling ancestor (the legend's own scroll area, clipped by the panel)."""
        return self.panel(title).evaluate(r"""panel => {
          const clips = [];
          for (let e = panel.querySelector('table'); e && e !== panel.parentElement; e = e.parentElement) {
            const s = getComputedStyle(e);
            if (/(auto|scroll|hidden)/.test(s.overflowY) || e === panel) clips.push(e.getBoundingClientRect());
          }
          return Array.from(panel.querySelectorAll('table tbody tr')).filter(r => {
            const b = r.getBoundingClientRect();
            return clips.some(c => b.top < c.top - 1 || b.bottom > c.bottom + 1);
          }).map(r => r.querySelector('button') ? r.querySelector('button').title : r.textContent);
        }""")

    def truncated(self, title, prefix="BlockStack"):
        """The texts starting with `prefix` (alert names) that a table panel cuts short: a cell, or
        an element in it, narrower than its text."""
        return self.panel(title).evaluate(
            r"""(panel, prefix) => {
          const cut = [];
          for (const cell of panel.querySelectorAll('[role="gridcell"], [role="cell"]')) {
            const text = cell.textContent.trim();
            if (!text.startsWith(prefix)) continue;
            const els = [cell, ...cell.querySelectorAll('*')];
            if (els.some(e => e.scrollWidth > e.clientWidth + 1)) cut.push(text);
          }
          return cut;
        }""",
            prefix,
        )

    def annotations(self, title):
        return self.panel(title).locator(ANNOTATION).count()

    def table_rows(self, title):
        """The data rows a table panel renders: [[cell texts]] (header rows left out)."""
        return (
            self.panel(title)
            .locator('[role="row"]')
            .evaluate_all(
                "rows => rows.filter(r => !r.querySelector('[role=\"columnheader\"]'))"
                '.map(r => Array.from(r.querySelectorAll(\'[role="gridcell"], [role="cell"]\'))'
                ".map(c => c.textContent.trim()))"
            )
        )

    def red(self, title):
        """What a panel paints red, as a reader sees it: [(text, text of its table row or "")] of every
        visible element whose background (colour or gradient) or text is red (hue within 30 degrees of
        red, saturated), the row's cells joined by " | ". Canvas drawings (graph lines, threshold lines)
        are not elements and not seen; elements of at most 24x24 px (legend swatches, annotation
        markers) or at most 8 px high (annotation regions) are left out."""
        return self.panel(title).evaluate(RED_JS)


# Grafana's reds (#F2495C, #E02F44, #C4162A, #FF7383 ...) by hue; orange (#FF9830) and the rest are not.
RED_JS = r"""panel => {
  // every colour of the value red: hue within 30 degrees of pure red, saturated, opaque enough (a
  // stat's gradient shifts its colour's hue a little: orange's reddest stop stays above 12 degrees)
  const red = c => {
    const parts = c.replace(/rgba?\(|\)/g, '').split(',').map(Number);
    const [r, g, b] = parts.slice(0, 3).map(v => v / 255), a = parts.length > 3 ? parts[3] : 1;
    const max = Math.max(r, g, b), min = Math.min(r, g, b);
    if (a < 0.5 || max - min < 0.35 || max < 0.6) return false;
    const hue = max === r ? (60 * (g - b) / (max - min) + 360) % 360 : 180;
    return hue <= 12 || hue >= 330;
  };
  const reds = text => {
    const colours = text.match(/rgba?\([^)]*\)/g) || [];
    return colours.length > 0 && colours.every(red);
  };
  const out = [];
  for (const el of panel.querySelectorAll('*')) {
    const style = getComputedStyle(el), box = el.getBoundingClientRect();
    // small or thin ones are legend swatches and annotation markers and regions: series colours and
    // the pages' own marks
    if ((box.width <= 24 && box.height <= 24) || box.height <= 8 || box.width === 0
        || style.visibility === 'hidden') continue;
    const painted = reds(style.backgroundColor) || reds(style.backgroundImage)
      || (el.childElementCount === 0 && el.textContent.trim() && reds(style.color));
    if (!painted) continue;
    const row = el.closest('[role="row"]');
    const cells = row ? Array.from(row.querySelectorAll('[role="gridcell"], [role="cell"]')) : [];
    out.push([el.textContent.trim(), cells.map(c => c.textContent.trim()).join(' | ')]);
  }
  return out;
}"""


def _text(locator):
    return locator.first.inner_text().strip() if locator.count() else None
