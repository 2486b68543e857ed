"""One headless Chromium for envpool/miniwob.py: start, drive MiniWoB's page API, stop for sure.

Process hygiene is the point of this module. chromedriver starts in a session of its own, so it
and every Chromium process it starts share one process group (Chromium's crash handlers leave
the group, but they exit with the browser). A watchdog (`sh`, ~1 MB) holds the read end of a
pipe whose write end only this process has: when this process dies without `close()` (the
pool's call timeout kills a worker whose page hangs; an OOM kill), the pipe closes and the
watchdog kills the group and deletes the browser's profile; `close()` writes a line first,
which lets the watchdog exit quietly. The watchdog is forked away from this process (`setsid
-f`) because Ray kills a dead worker's direct children, and it would go with chromedriver, while
Chromium, a grandchild, lived on. Without it every killed worker left ~0.9 GB of Chromium behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from miniwob.fields import get_field_extractor
from miniwob.selenium_instance import HTML_DIR
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.action_chains import ActionChains

# Headless, no sandbox (containers run as root), and nothing that talks to the network: the task
# pages are local files; host names other than localhost resolve to nothing.
# The watchdog ($0: the profile). A line on stdin: closed normally, exit. EOF (its owner died):
# kill chromedriver's group once the owner had recorded it, then any browser started with this
# profile (one still starting has no recorded group yet), then delete the profile.
_WATCH = ('read _ && exit; pg=$(cat "$0.pgid" 2>/dev/null); [ -n "$pg" ] && kill -9 "-$pg"; '
          'pkill -9 -f -- "user-data-dir=$0"; rm -rf "$0" "$0.pgid"')
_FLAGS = (
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
    "--disable-extensions", "--disable-background-networking", "--disable-component-update",
    "--disable-default-apps", "--disable-sync", "--no-first-run", "--mute-audio",
    "--disable-features=Translate,MediaRouter,OptimizationHints",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost",
    "--js-flags=--max-old-space-size=256", "--window-size=500,500",
)  # fmt: skip
_READY_TRIES = 40  # x 25 ms: how long a task may report WOB_TASK_READY = false after a reset


class Browser:
    """A Chromium under chromedriver, on MiniWoB task pages. Any WebDriver error marks it
    broken (`alive()` turns False) and propagates: the env starts a new one at its next reset."""

    def __init__(self, chromium: str, chromedriver: str, call_timeout_s: float) -> None:
        for path in (chromium, chromedriver):
            if not shutil.which(path):
                raise FileNotFoundError(f"{path} not found: install chromium and "
                                        "chromium-driver (make install-dev)")
        self._profile = tempfile.mkdtemp(prefix="horizonrl-miniwob-")
        options = webdriver.ChromeOptions()
        options.binary_location = chromium
        for flag in (*_FLAGS, f"--user-data-dir={self._profile}"):
            options.add_argument(flag)
        service = Service(chromedriver, popen_kw={"start_new_session": True})
        # The watchdog starts before the browser: a worker killed while the browser starts
        # (Ray's OOM killer picks workers still in __init__) must not leave it behind.
        watchdog = subprocess.Popen(["setsid", "-f", "/bin/sh", "-c", _WATCH, self._profile],
                                    stdin=subprocess.PIPE)
        watchdog.wait()  # setsid itself returns at once; its forked child watches
        self._watchdog: subprocess.Popen | None = None
        self._broken = False
        self._page: str | None = None
        try:
            self.driver = webdriver.Chrome(service=service, options=options)
        except BaseException:
            if service.process is not None:
                self._kill_group(service.process.pid)
            with contextlib.suppress(OSError):
                watchdog.stdin.close()  # EOF: the watchdog sweeps what is left, and the profile
            raise
        self._driver_proc: subprocess.Popen = service.process
        self._pgid = self._driver_proc.pid  # start_new_session: the session leader's pid
        Path(f"{self._profile}.pgid").write_text(str(self._pgid))
        self._watchdog = watchdog
        self.driver.set_script_timeout(call_timeout_s)
        self.driver.set_page_load_timeout(call_timeout_s)

    # ------------------------------------------------------------------------- page API
    def script(self, js: str, *args: Any) -> Any:
        """Run JavaScript in the page and return its value."""
        try:
            return self.driver.execute_script(js, *args)
        except WebDriverException:
            self._broken = True
            raise

    def start_task(self, task: str, *, seed: str, limit_ms: int) -> None:
        """Show a new instance of `task`: its page (loaded once), seeded, timer set."""
        if self._page != task:
            try:
                self.driver.get(f"file://{HTML_DIR}/miniwob/{task}.html")
            except WebDriverException:
                self._broken = True
                raise
            self._page = task
        # Ending the previous episode first moves the page to a new episode id, which keeps
        # element refs from colliding with the last episode's (as miniwob's own reset does).
        self.script("core.endEpisode(0); Math.seedrandom(arguments[0]);"
                    "core.EPISODE_MAX_TIME = arguments[1]; core.startEpisodeReal();",
                    seed, limit_ms)
        for _ in range(_READY_TRIES):
            if self.script("return WOB_TASK_READY;"):
                return
            time.sleep(0.025)
        raise RuntimeError(f"MiniWoB task {task} did not get ready")

    def utterance(self, task: str) -> tuple[str, dict[str, str]]:
        """The task's instruction and its fields (MiniWoB's parse of it)."""
        got = self.script("return core.getUtterance();")
        if isinstance(got, dict):
            return str(got["utterance"]), {str(k): str(v) for k, v in got["fields"].items()}
        return str(got), dict(get_field_extractor(task)(got))

    def dom(self) -> dict[str, Any]:
        return self.script("return core.getDOMInfo();")

    def click(self, ref: int) -> None:
        self.script("core.elementClick(arguments[0]);", ref)

    def type(self, ref: int, text: str) -> None:
        """Replace the field's text: clear it, click into it, type `text` key by key."""
        self.script("core.previousDOMInfo[arguments[0]].value = '';"
                    "core.elementClick(arguments[0]);", ref)
        self.press(text)

    def press(self, keys: str) -> None:
        """Send keystrokes to the focused element."""
        try:
            ActionChains(self.driver, duration=0).send_keys(keys).perform()
        except WebDriverException:
            self._broken = True
            raise

    def done(self) -> bool:
        return bool(self.script("return WOB_DONE_GLOBAL;"))

    def result(self) -> tuple[bool, float]:
        """(episode over, MiniWoB's raw reward: without its wall-clock time factor)."""
        done, raw = self.script("return [WOB_DONE_GLOBAL, WOB_RAW_REWARD_GLOBAL];")
        return bool(done), float(raw or 0.0)

    # ------------------------------------------------------------------------- lifecycle
    def alive(self) -> bool:
        """False once a call failed or chromedriver or the browser's main process is gone."""
        if self._broken or self._watchdog is None or self._driver_proc.poll() is not None:
            return False
        with contextlib.suppress(psutil.Error):
            for kid in psutil.Process(self._driver_proc.pid).children():
                if kid.status() != psutil.STATUS_ZOMBIE:
                    return True
        return False

    def process_ids(self) -> list[int]:
        """chromedriver and every live process under it (the browser and its helpers)."""
        if self._watchdog is None or self._driver_proc.poll() is not None:
            return []
        pids = [self._driver_proc.pid]
        with contextlib.suppress(psutil.Error):
            for kid in psutil.Process(self._driver_proc.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if kid.status() != psutil.STATUS_ZOMBIE:
                        pids.append(kid.pid)
        return pids

    def close(self) -> None:
        """Quit the browser (kill it if it is broken), then everything left in its group, the
        watchdog, and the profile. Safe to call twice."""
        if self._watchdog is None:
            return
        if not self._broken:
            with contextlib.suppress(Exception):  # a dead browser cannot quit politely
                self.driver.quit()
        self._kill_group(self._pgid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._driver_proc.wait(timeout=5)
        with contextlib.suppress(OSError):  # a line, not EOF: the watchdog exits, kills nothing
            self._watchdog.stdin.write(b"closed\n")
            self._watchdog.stdin.close()
        self._watchdog = None
        shutil.rmtree(self._profile, ignore_errors=True)
        Path(f"{self._profile}.pgid").unlink(missing_ok=True)

    @staticmethod
    def _kill_group(pgid: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
