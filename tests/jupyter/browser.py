"""Browser tests: JupyterLab in a real headless Chromium, driven by Playwright.

Reusable by any test under tests/jupyter (the fixtures ``browser`` and ``lab`` are in this
folder's conftest.py):

- ``launch_browser()``: Debian's chromium (``/usr/bin/chromium``, installed by
  scripts/system-deps.sh) through Playwright's python package (the ``test`` extra); Playwright's
  own browser download is never used. Missing either skips through ``service_missing`` (a
  failure under NOTEBOOKOS_REQUIRE_SERVICES=1).
- ``Lab``: one JupyterLab page: open a new notebook from the launcher with a given kernel, type
  and run cells, read a cell's prompt and outputs, read a dialog.

Everything stays on loopback: the flags below switch off Chromium's own network traffic, and
the JupyterLab servers the tests start fetch no news and check no updates.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

CHROMIUM = os.environ.get("NOTEBOOKOS_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]
# JupyterLab server options for browser tests: no news feed, no update check (no network).
LAB_ARGS = ("--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate")


def browser_missing() -> str | None:
    """Why browser tests cannot run here, or None."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright's python package is not installed (make install-test)"
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)) \
            and shutil.which(CHROMIUM) is None:
        return f"no chromium at {CHROMIUM} (scripts/system-deps.sh installs Debian's)"
    return None


@contextmanager
def launch_browser() -> Iterator[Any]:
    """A headless Chromium (Playwright ``Browser``), closed on exit."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS,
                                             headless=True)
        try:
            yield browser
        finally:
            browser.close()


class Lab:
    """One JupyterLab page in its own browser context."""

    def __init__(self, browser: Any, url: str, timeout_s: float = 90.0) -> None:
        self.context = browser.new_context(viewport={"width": 1400, "height": 900})
        self.page = self.context.new_page()
        self.page.set_default_timeout(timeout_s * 1000)
        self.page.goto(url)
        self.page.locator(".jp-Launcher").first.wait_for(state="visible")

    def close(self) -> None:
        self.context.close()

    def screenshot(self, path: str) -> str:
        """Save what the page shows (for a failing test's report); returns the path."""
        self.page.screenshot(path=path)
        return path

    # -- notebooks ------------------------------------------------------------------------------

    def new_notebook(self, kernel_display_name: str) -> float:
        """Open a new notebook from the launcher with that kernel; returns the monotonic time
        its first cell's editor appeared."""
        section = self.page.locator(".jp-Launcher-section").filter(has_text="Notebook").first
        card = section.locator(".jp-LauncherCard").filter(has_text=kernel_display_name).first
        card.click()
        editor = self.page.locator(".jp-NotebookPanel .jp-Cell .cm-content").first
        editor.wait_for(state="visible")
        return time.monotonic()

    def wait_kernel_idle(self, timeout_s: float = 90.0) -> None:
        """Wait until the status bar shows the notebook's kernel as Idle. JupyterLab drops a cell
        that is run before the session's kernel is connected (a plain ipykernel too: a cell run
        right after the editor appears is lost in about half the tries), so a test that is not
        about that race waits, as a user waits for the kernel indicator."""
        self.page.locator("#jp-main-statusbar").filter(
            has_text=re.compile(r"\| Idle")).first.wait_for(state="visible",
                                                            timeout=timeout_s * 1000)

    def cell(self, index: int) -> Any:
        return self.page.locator(".jp-NotebookPanel:visible .jp-Notebook .jp-Cell").nth(index)

    def run_cell(self, index: int, code: str) -> None:
        """Type ``code`` into cell ``index`` and run it with Shift+Enter (as a user does)."""
        editor = self.cell(index).locator(".cm-content")
        editor.click()
        self.page.keyboard.type(code)
        self.page.keyboard.press("Shift+Enter")

    def prompt(self, index: int) -> str:
        """The cell's execution prompt text, e.g. ``[1]:``, ``[*]:`` or ``[ ]:``."""
        return self.cell(index).locator(".jp-InputPrompt").inner_text().strip()

    def wait_output(self, index: int, text: str, timeout_s: float = 60.0) -> str:
        """Wait until cell ``index``'s output area contains ``text``; returns all its text."""
        outputs = self.cell(index).locator(".jp-OutputArea")
        outputs.filter(has_text=text).first.wait_for(state="visible",
                                                      timeout=timeout_s * 1000)
        return outputs.inner_text()

    def output_text(self, index: int) -> str:
        area = self.cell(index).locator(".jp-OutputArea")
        return area.inner_text() if area.count() else ""

    def kernel_status(self) -> str:
        """The notebook toolbar's kernel status (e.g. "Kernel status: Idle")."""
        indicator = self.page.locator(
            ".jp-NotebookPanel:visible .jp-Notebook-ExecutionIndicator").first
        return (indicator.get_attribute("title") or "") if indicator.count() else ""

    def restart_kernel(self) -> None:
        """Restart the notebook's kernel as a user does: Esc, then 0 0 in command mode, and
        the dialog's Restart button."""
        self.page.locator(".jp-NotebookPanel:visible .jp-Notebook").first.click()
        self.page.keyboard.press("Escape")
        self.page.keyboard.press("0")
        self.page.keyboard.press("0")
        dialog = self.page.locator(".jp-Dialog-content").first
        dialog.wait_for(state="visible")
        dialog.locator(".jp-Dialog-footer button.jp-mod-accept").click()
        dialog.wait_for(state="hidden")

    # -- dialogs --------------------------------------------------------------------------------

    def dialog_text(self, timeout_s: float = 60.0) -> str:
        """The text of the next JupyterLab dialog (e.g. "Error Starting Kernel")."""
        dialog = self.page.locator(".jp-Dialog-content").first
        dialog.wait_for(state="visible", timeout=timeout_s * 1000)
        return dialog.inner_text()
