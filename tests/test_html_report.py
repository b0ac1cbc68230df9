"""`python -m matrix html`, opened in a real browser (headless Chromium through Selenium): a cell
is coloured by its runs, and clicking a failing cell shows its runs and their repro command."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kit.report.record import read_results_file
from kit.report.results import write_results
from matrix import html
from scripts.setup import browser_paths
from tests.test_matrix import REPO, kf_text, rec

REPRO = "python -m kit run --backend be --mode decode --exec eager --case c"


def _browser():
    """(browser, driver) executables, or why there are none. Without them the test is skipped on a
    developer's machine, and fails under CI (CI=true), which must install them (.ci/run)."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return None, "selenium is not installed (pip install -e .[test])"
    found = browser_paths()
    if found is None:
        return None, "no chromium and chromedriver here (python scripts/setup.py cpu installs them)"
    return found, ""


@pytest.fixture
def chrome():
    found, why = _browser()
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the browser test: {why}")
        pytest.skip(why)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = found[0]
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(found[1]), options=options)
    yield driver
    driver.quit()


@pytest.fixture
def page(tmp_path):
    (tmp_path / "results").mkdir()
    write_results(tmp_path / "results" / "cpu.json", [
        rec("a"), rec("b"), {**rec("c", "fail", "kernel", message="layer 0 output wrong: max err 0.5 > tol 0.01",
                                    max_err=0.5, tol=0.01), "repro": REPRO},
        rec("a", backend="other"), rec("a", exec_="graph", backend="other"),
        rec("b", "fail", "graph", exec_="graph", backend="other")])
    (tmp_path / "KF.md").write_text(kf_text(
        "| KF-1 | be | decode | eager | c | * | kernel | xfail | the window keeps W keys | "
        "https://github.com/org/repo/pull/7 backends/triton/kernels.py#L40 |"))
    out = tmp_path / "report.html"
    proc = subprocess.run([sys.executable, "-m", "matrix", "html", "--known-failures", str(tmp_path / "KF.md"),
                           "--results-dir", str(tmp_path / "results"), "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return out


def test_the_failing_cells_are_listed_first_and_each_cells_runs_link_back(page):
    text = page.read_text()
    summary = text.split("<h2>Failing cells (1)</h2>", 1)[1].split("</ul>", 1)[0]
    assert 'href="#runs-0-other-decode-graph"' in summary and "✗ 1/2 graph" in summary, summary
    sections = text.split('<section class="runs"')[1:]
    assert len(sections) == 2 and all('<a href="#table-0">back to the table</a>' in s for s in sections)
    assert '<table id="table-0">' in text


def test_an_interrupted_run_says_so_at_the_top(tmp_path):
    """Its page is drawn (what it recorded) under a line saying what it lacks; stderr says it too."""
    path = tmp_path / "results-local.json"
    write_results(path, [rec("a")], run=dict(status="running", selected=[f"be-decode-eager-{c}" for c in "abc"],
                                             catalog=[f"be-decode-eager-{c}" for c in "abc"]))
    out = tmp_path / "report.html"
    proc = subprocess.run([sys.executable, "-m", "matrix", "html", "--results", str(path), "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0 and "interrupted run (running): 1 of 3 selected runs recorded" in proc.stderr, proc.stderr
    top = out.read_text().split("<h2>", 1)[0]
    assert '<p class="warning">' in top and "interrupted run (running): 1 of 3 selected runs recorded" in top, top


def test_a_cell_whose_runs_partly_never_ran_does_not_read_whole(tmp_path):
    """An interrupted run's cell read `✓ 16/16` with 8 of its 24 runs missing."""
    path = tmp_path / "results-local.json"
    selected = [f"be-decode-eager-{c}" for c in "abc"] + ["be-decode-graph-a"]
    write_results(path, [rec("a"), rec("b"), rec("a", exec_="graph")],
                  run=dict(status="interrupted", selected=selected, catalog=selected))
    text = html.page({"r": read_results_file(path)}, [])
    assert '<td class="partial">✓ 2/2, 1 never run</td>' in text, text
    assert '<td class="pass">✓ 1/1</td>' in text  # the graph cell ran whole


def test_page_has_no_external_assets(page):
    text = page.read_text()
    assert "<script" not in text and "<link" not in text and "<img" not in text and "@import" not in text
    assert 'href="http' in text  # the entry's thread: a link to follow, not an asset to load


def test_clicking_a_failing_cell_shows_its_runs_and_repro(chrome, page):
    from selenium.webdriver.common.by import By
    chrome.get(page.as_uri())
    xfail = chrome.find_element(By.CSS_SELECTOR, "td.xfail")
    passing = chrome.find_element(By.CSS_SELECTOR, "td.pass")
    failing = chrome.find_element(By.CSS_SELECTOR, "td.fail")
    colours = {td.value_of_css_property("background-color") for td in (xfail, passing, failing)}
    assert len(colours) == 3, colours
    assert "xfail 1/3 (KF-1)" in xfail.text and "✓ 2/3" in xfail.text
    repro = chrome.find_element(By.XPATH, f"//code[text()='{REPRO}']")
    assert not repro.is_displayed()  # runs stay folded until their cell is clicked
    xfail.find_element(By.TAG_NAME, "a").click()
    assert repro.is_displayed()
    runs = repro.find_element(By.XPATH, "ancestor::section").text
    for shown in ("be-decode-eager-c", "fail [kernel]", "max err 0.5 > tol 0.01", "0.5 / 0.01", "KF-1",
                  "the window keeps W keys", "https://github.com/org/repo/pull/7"):
        assert shown in runs, (shown, runs)
    failing.find_element(By.TAG_NAME, "a").click()
    assert not repro.is_displayed()
    shown = chrome.find_element(By.CSS_SELECTOR, "section.runs:target")
    assert "no entry covers this failure" in shown.text
    shown.find_element(By.LINK_TEXT, "back to the table").click()
    assert not shown.is_displayed() and chrome.current_url.endswith("#table-0")
    chrome.find_element(By.CSS_SELECTOR, "ul a[href^='#runs-']").click()  # the failing cells, listed at the top
    assert chrome.find_element(By.CSS_SELECTOR, "section.runs:target") == shown and shown.is_displayed()
