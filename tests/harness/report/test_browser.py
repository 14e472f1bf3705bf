"""The report of a real run opens in headless Chromium with every figure decoded and the
summary table present. Skips where Chromium is not installed (.ci/run installs it)."""
import re
import shutil
import subprocess

import pytest
import yaml

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def dump_dom(page, profile, width: int = 1280) -> str:
    """The DOM after load, as the page's own script left it (virtual time lets the load
    event and the script run before the dump), in a window `width` pixels wide."""
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--window-size={width},900",
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


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_a_sweep_report_shows_its_failed_cell_in_chromium(tmp_path):
    """A beam-width sweep (noop and hf, tiny model) with one width past the declared bound:
    the page opens with every figure decoded, the refused cell's rows are marked failed with
    the reason, and the other cells are measured."""
    from typer.testing import CliRunner

    from harness.cli import app
    from tests.harness.report.conftest import SCENARIOS

    spec = yaml.safe_load((SCENARIOS / "smoke_beam.yaml").read_text())
    spec["bounds"]["max_beam_width"] = 8  # W=16 lies past it: every engine refuses that cell
    spec["sweep"] = {"beam_width": [4, 8, 16]}
    path = tmp_path / "sweep_beam.yaml"
    path.write_text(yaml.safe_dump(spec))
    res = CliRunner().invoke(app, ["run", str(path), "--engine", "hf", "--engine", "noop", "--requests", "2",
                                   "--concurrency", "1", "--peak-tflops", "0.5", "--out", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output  # a failed cell is a row, not an exit code
    page = tmp_path / "run" / "report.html"
    n_img = page.read_text().count("<img ")
    dom = dump_dom(page, tmp_path / "profile")
    assert re.search(r'data-images-loaded="(\d+)/(\d+)"', dom).groups() == (str(n_img), str(n_img))
    assert "Latency against beam_width" in dom and "Throughput against beam_width" in dom
    summary = dom[dom.index('id="summary"'):]
    summary = summary[: summary.index("</table>")]
    rows = re.findall(r"<tr( class=\"[^\"]*\")?>(.*?)</tr>", summary, re.S)[1:]
    tds = [re.findall(r"<td[^>]*>(.*?)</td>", body, re.S) for _, body in rows]
    cells = {(td[0], td[1]): ("failed" in cls, body) for (cls, body), td in zip(rows, tds)}
    assert sorted(cells) == sorted((e, w) for e in ("hf", "noop") for w in ("4", "8", "16"))
    for (engine, width), (failed, body) in cells.items():
        assert failed == (width == "16"), (engine, width, body)
        if failed:
            assert '<b class="bad">failed</b>' in body and "beam_width" in body and "8" in body
        else:
            assert "<td>2 / 2</td>" in body


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_the_report_fits_a_1280_pixel_window(prefill_run, tmp_path):
    """No horizontal page scroll at 1280 px, even with long unbroken text in the warnings,
    paths and engine settings: wide tables scroll inside their own box, text cells wrap. The
    page's script writes the page's scroll width against the window's into the DOM."""
    import json
    import shutil

    from typer.testing import CliRunner

    from harness.cli import app

    wide = tmp_path / "wide"
    shutil.copytree(prefill_run, wide)
    run = json.loads((wide / "run.json").read_text())
    long = "x" * 400
    run["warnings"] = run["warnings"] + [f"a warning with an unbroken {long}"]
    run["model_dir"] = "/very/long/path/" + "/".join(["segment"] * 60)
    run["engines"][0]["describe"]["settings"] = {f"option_{k}": long[:40] for k in range(30)}
    run["command"] = ["bench", "run", "--out", "/" + long]
    (wide / "run.json").write_text(json.dumps(run))
    res = CliRunner().invoke(app, ["report", str(wide)])
    assert res.exit_code == 0, res.output
    for page in (prefill_run / "report.html", wide / "report.html"):
        dom = dump_dom(page, tmp_path / "profile")
        marker = re.search(r'data-page-width="(\d+)/(\d+)"', dom)
        assert marker, "the page's load script did not run"
        scroll, client = map(int, marker.groups())
        assert 1200 <= client <= 1280 and scroll <= client, f"{page}: page {scroll} px wide in a {client} px window"
