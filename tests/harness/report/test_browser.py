"""The report of a real run opens in headless Chromium with every figure decoded and the
summary table present. Skips where Chromium is not installed (.ci/run installs it)."""
import re
import shutil
import subprocess

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def dump_dom(page, profile) -> str:
    """The DOM after load, as the page's own script left it (virtual time lets the load
    event and the script run before the dump)."""
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={profile}", "--virtual-time-budget=5000", "--dump-dom", page.as_uri()]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_report_opens_in_chromium_with_every_image_decoded(prefill_run, tmp_path):
    page = prefill_run / "report.html"
    n_img = page.read_text().count("<img ")
    assert n_img >= 3
    dom = dump_dom(page, tmp_path / "profile")
    marker = re.search(r'data-images-loaded="(\d+)/(\d+)"', dom)
    assert marker, "the page's load script did not run"
    assert marker.groups() == (str(n_img), str(n_img)), f"decoded/total images: {marker.group(0)}"
    summary = dom[dom.index('id="summary"'):]
    summary = summary[: summary.index("</table>")]
    assert summary.count("<tr") == 1 + 4  # header + hf and noop at concurrency 1 and 2
