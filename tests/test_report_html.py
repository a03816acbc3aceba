"""The self-contained HTML report: images, tables and gallery on hand-made runs, then a real run in Chromium.

The fast tests build runs by hand (records, continuation videos, an official-layout manifest) so
every number and pixel the page shows is known. The slow test makes a real 2-method x 4-task run with
the CLI on a tiny MiniWorld suite, renders its report with ``python -m cmbench report`` and drives it
in headless Chromium (Debian's ``chromium`` + ``chromium-driver``; .ci/run installs them).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from cmbench.cli.main import main
from cmbench.data.video import write_lossless_video, write_video
from cmbench.report import gallery, html
from cmbench.report.frame_curves import frame_curves
from cmbench.report.html import build_report, format_value
from cmbench.report.leaderboard import ReportError, write_reports
from cmbench.runs.output_folder import MARKER
from official_fixture import official_row, write_context_video, write_manifest
from test_run_command import REPO, SMALL_SUITE

CONTINUATION = 6  # frames per hand-made continuation
BOX = [0.25, 0.25, 0.75, 0.75]  # detected box of the hand-made detections
REF_BOX = [0.1, 0.2, 0.5, 0.6]  # official_row's reference box


def local_refs(text: str) -> list[str]:
    """Every src / href / url(...) the page refers to."""
    return re.findall(r'(?:src|href|srcset|poster|action)\s*=\s*"([^"]*)"', text) + re.findall(r"url\(([^)]*)\)", text)


def assert_self_contained(index: Path) -> list[str]:
    """No reference leaves the folder; URLs appear only as text of the run configs. Returns the image paths."""
    text = index.read_text()
    refs = local_refs(text)
    for ref in refs:
        assert not re.match(r"^\s*([a-z][a-z0-9+.-]*:|//)", ref, re.I), f"external reference {ref!r} in {index}"
    assert "@import" not in text
    outside_configs = re.sub(r'<pre class="config">.*?</pre>', "", text, flags=re.S)
    assert "://" not in outside_configs
    images = [r for r in refs if not r.startswith("#")]
    for ref in images:
        assert (index.parent / ref).is_file(), f"{ref} referenced by {index} does not exist"
    return images


def table_rows(text: str, table_id: str) -> list[dict[str, str]]:
    """The rows of a rendered table as ``{column key: shown text}``."""
    block = re.search(rf'data-table="{table_id}".*?</table>', text, re.DOTALL).group(0)
    keys = re.findall(r'data-key="([^"]+)"', block)
    body = block.split("<tbody>")[1]
    rows = []
    for row in re.findall(r"<tr>(.*?)</tr>", body, re.DOTALL):
        cells = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.DOTALL)]
        rows.append(dict(zip(keys, cells)))
    return rows


# ---------------------------------------------------------------- hand-made runs


def continuation_frames(seed: int) -> np.ndarray:
    """``uint8 [6, 16, 16, 3]``: grey, with a bright square that moves one pixel per frame."""
    frames = np.full((CONTINUATION, 16, 16, 3), 90, dtype=np.uint8)
    for t in range(CONTINUATION):
        frames[t, 4:10, 2 + t : 8 + t] = (200, 40 + 30 * seed, 40)
    return frames


def record(label: str, task_id: str, context: str, score: float | None, best: int | None, **over) -> dict:
    sims: list[float | None] = [None] * CONTINUATION
    boxes: list[list[float] | None] = [None] * CONTINUATION
    if best is not None:
        sims[best] = score
        boxes[best] = BOX
        sims[0], boxes[0] = (score or 0) / 2, [0.0, 0.0, 0.5, 0.5]
    row = {
        "task_id": task_id, "context_id": context, "source": "real" if task_id.startswith("real") else "synthetic",
        "task_type": "revisit" if "revisit" in task_id else "reappear", "seed": 7, "label": label, "method": label,
        "status": "ok", "error": None, "score": score, "similarities": sims, "boxes": boxes,
        "detection_rate": sum(s is not None for s in sims) / CONTINUATION, "pr": 0.0 if label == "fullkv" else 0.9,
        "context_pr": 0.0, "peak_kv_bytes": 4_000_000, "continuation_seconds": 1.0,
        "continuation_frames": CONTINUATION, "scorer_hash": "abc123def456", "scorer": "light", "metric": "light",
        "config_hash": f"hash-{label}", "git_commit": "0123abcd", "versions": {"cmbench": "0.1.0", "torch": "2.13.0"},
    }
    row.update(over)
    return row


def write_run(root: Path, name: str, data_root: Path, rows: list[dict], lossless: bool = False) -> Path:
    """A run directory; ``lossless``: the records name a lossless ``.mkv`` (and no mp4 is written)."""
    run = root / name
    (run / "videos").mkdir(parents=True)
    (run / "config.yaml").write_text(
        f"data:\n  name: official\n  root: {data_root}\n  manifest: metadata.jsonl\nmethod:\n"
        f"  name: {rows[0]['label']}\n  paper: https://arxiv.org/abs/0000.00000\n")
    for i, r in enumerate(rows):
        if r["status"] == "ok" and lossless:
            r["video"] = f"videos/{r['task_id']}.mkv"
            write_lossless_video(run / r["video"], continuation_frames(i), 16.0)
        elif r["status"] == "ok":
            write_video(run / "videos" / f"{r['task_id']}.mp4", continuation_frames(i), 16.0)
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


@pytest.fixture
def made_runs(tmp_path):
    data = tmp_path / "data"
    write_context_video(data / "videos/synthetic/a.mp4", seed=1)
    write_context_video(data / "videos/real/b.mp4", seed=2)
    write_manifest(data, [
        official_row("syn_a_reappear_01", "videos/synthetic/a.mp4"),
        official_row("syn_a_revisit_01", "videos/synthetic/a.mp4", task_type="revisit"),
        official_row("real_b_reappear_01", "videos/real/b.mp4", source="real"),
    ])
    full = write_run(tmp_path / "runs", "fullkv", data, [
        record("fullkv", "syn_a_reappear_01", "a", 0.9, 3),
        record("fullkv", "syn_a_revisit_01", "a", 0.8, 2),
        record("fullkv", "real_b_reappear_01", "b", 0.7, 4),
    ], lossless=True)
    deco = write_run(tmp_path / "runs", "deco", data, [
        record("deco", "syn_a_reappear_01", "a", 0.3, 3),  # drop 0.6
        record("deco", "syn_a_revisit_01", "a", 0.0, None, detection_rate=0.0),  # never detected: drop 0.8
        record("deco", "real_b_reappear_01", "b", None, None, status="failed",
               error="Traceback ...\nRuntimeError: the GPU caught fire"),
    ])
    return tmp_path, data, full, deco


def test_display_size_upscales_small_frames_by_whole_factors_and_shrinks_large_ones():
    assert gallery.display_size(32, 32) == (128, 128)
    assert gallery.display_size(16, 16) == (128, 128)
    assert gallery.display_size(24, 40) == (96, 160)  # factor ceil(128 / 40) = 4
    assert gallery.display_size(480, 832) == (148, 256)
    assert gallery.display_size(200, 150) == (200, 150)
    checker = np.zeros((1, 2, 2, 3), dtype=np.uint8)
    checker[0, 0, 1] = checker[0, 1, 0] = 255
    big = gallery.fit_frames(np.repeat(np.repeat(checker, 8, axis=1), 8, axis=2))  # 16x16 -> 128x128
    assert big.shape == (1, 128, 128, 3)
    assert (big[0, :64, :64] == 0).all() and (big[0, :64, 64:] == 255).all() and (big[0, 64:, 64:] == 0).all()


def test_best_frame_is_the_argmax_over_detected_frames():
    assert gallery.best_frame([None, 0.2, 0.9, 0.9, None]) == 2
    assert gallery.best_frame([0.1, None, 0.4]) == 2
    assert gallery.best_frame([None, None]) is None
    assert gallery.best_frame([]) is None


def test_values_are_formatted_by_what_their_column_is():
    assert format_value("pr", 0.94031).text == "94.03%"
    assert format_value("matched_pr", 0.85).text == "85.00%"
    assert format_value("score_ci95", 0.01481).text == "± 0.0148"
    assert format_value("peak_kv_bytes", 54_530_000.0).text == "54.53"
    assert format_value("speedup_vs_fullkv", 7.341).text == "7.34x"
    assert format_value("n_tasks", np.int64(116)).text == "116"
    nan = format_value("score", math.nan)
    assert nan.text == "—" and nan.sort == ""
    assert format_value("method", "DeCoPrune") == html.Cell("DeCoPrune", "decoprune", False)
    assert float(format_value("score", 0.95461).sort) == 0.95461 and format_value("score", 0.95461).text == "0.9546"


def test_report_of_hand_made_runs(made_runs):
    tmp, data, full, deco = made_runs
    out = tmp / "report"
    build_report([full], out)  # an older report, with an image the new one does not have
    (out / "img" / "stale.png").write_bytes(b"left over from an older report")
    result = build_report([deco, full], out)
    assert result.methods == ["fullkv", "deco"] and result.tasks == 3
    assert not (out / "img" / "stale.png").exists()
    text = result.index.read_text()
    images = assert_self_contained(result.index)
    # 2 plots + 3 reference frames + (3 fullkv + 2 finished deco tasks) x (animation + best frame)
    assert len(images) == 2 + 3 + 5 * 2 == len(set(images))
    assert result.files == len(images) + 1  # the page's files: the write guard's marker is not one
    assert result.bytes == sum(p.stat().st_size for p in out.rglob("*") if p.is_file() and p.name != MARKER)
    assert (out / MARKER).is_file()

    board = table_rows(text, "leaderboard")
    assert [(r["method"], r["metric"], r["score"]) for r in board] == [("fullkv", "light", "0.8000"),
                                                                       ("deco", "light", "0.1500")]  # 0.3 and 0.0
    assert ">light<" in re.search(r'<th[^>]*data-key="score".*?</th>', text, re.DOTALL).group(0)  # named by metric
    assert re.search(r'<a href="#method=deco"', text)

    # deco's view opens with its losses against FullKV, the largest drop first
    panel = re.search(r'<section class="losses" data-method="deco".*?</section>', text, re.DOTALL).group(0)
    assert re.findall(r'href="#task-([^"]+)"', panel) == ["syn_a_revisit_01", "syn_a_reappear_01"]
    assert "+0.8000" in panel and "+0.6000" in panel
    assert 'class="losses" data-method="fullkv"' not in text
    assert "RuntimeError: the GPU caught fire" in text and "never detected" in text
    assert "https://arxiv.org/abs/0000.00000" in text  # the run config, shown as text
    assert text.count("<details class=\"run\">") == 2

    # images: the reference frame with its box, the best frame with the detected box, the animation
    ref = np.asarray(Image.open(out / "img/ref/t0000_0.png").convert("RGB"))
    assert ref.shape == (128, 128, 3)
    x0, y0 = round(REF_BOX[0] * 128), round(REF_BOX[1] * 128)
    assert tuple(ref[y0 + 1, x0 + 20]) == gallery.REFERENCE_COLOUR  # on its top edge
    card = re.search(r'<article class="task" id="task-syn_a_reappear_01".*?</article>', text, re.DOTALL).group(0)
    best_src = re.search(r'src="(img/m01/[^"]+_best\.png)"', card).group(1)
    best = np.asarray(Image.open(out / best_src).convert("RGB"))
    assert tuple(best[32, 32 + 40]) == gallery.DETECTION_COLOUR  # BOX's top edge at y = 0.25 * 128
    assert tuple(best[64, 64]) != gallery.DETECTION_COLOUR
    assert "best frame 3" in card
    # the animation of small frames is stored at their own size, losslessly; the page upscales it
    animation = Image.open(out / best_src.replace("_best.png", ".webp"))
    assert animation.size == (16, 16) and animation.n_frames == CONTINUATION
    assert ".cell img { display: block; width: 128px; height: auto; image-rendering: pixelated; }" in text
    # FullKV's records name lossless continuations: the first frame's square is exactly its colour
    full_anim = re.search(r'src="(img/m00/[^"]+\.webp)"', card).group(1)
    first = np.asarray(Image.open(out / full_anim).convert("RGB"))
    assert tuple(first[5, 3]) == (200, 40, 40) and tuple(first[0, 0]) == (90, 90, 90)


def test_new_leaderboard_columns_show_without_template_edits(made_runs, monkeypatch):
    tmp, data, full, deco = made_runs
    original = html.leaderboard

    def with_matched_pr(runs, *curves):
        board = original(runs, *curves)
        return board.assign(matched_pr=[0.85] * len(board))

    monkeypatch.setattr(html, "leaderboard", with_matched_pr)
    text = build_report([full, deco], tmp / "report").index.read_text()
    board = re.search(r'data-table="leaderboard-more".*?</table>', text, re.DOTALL).group(0)  # the other columns
    assert 'data-key="matched_pr"' in board and ">matched pr<" in board and board.count(">85.00%<") == 2


def test_the_leaderboard_shows_score_at_85_pr_from_curves_and_says_where_it_comes_from(made_runs):
    import pandas as pd

    tmp, data, full, deco = made_runs
    curves = pd.DataFrame({"method": ["deco", "deco"], "test_pr": [0.8, 0.9], "score": [0.3, 0.1]})
    text = build_report([full, deco], tmp / "report", curves=curves).index.read_text()
    board = re.search(r'data-table="leaderboard".*?</table>', text, re.DOTALL).group(0)
    assert 'data-key="score_at_85pr"' in board and ">0.2000<" in board and board.count(">—<") >= 1
    assert "score_at_85pr: the method" in text and "interpolated linearly at realised PR 85%" in text
    plain = build_report([full, deco], tmp / "report2").index.read_text()
    assert "score_at_85pr" not in plain


def test_frame_curves_count_undetected_frames_as_zero(made_runs):
    _, _, full, deco = made_runs
    curves = frame_curves(html.load_runs([full, deco])).set_index(["method", "frame"])
    # fullkv: frame 0 holds half of each score, the best frames 3, 2 and 4 the scores 0.9, 0.8, 0.7
    assert curves.loc[("fullkv", 0), "mean_similarity"] == pytest.approx((0.45 + 0.4 + 0.35) / 3)
    assert curves.loc[("fullkv", 3), "mean_similarity"] == pytest.approx(0.9 / 3)
    assert curves.loc[("fullkv", 3), "detection_rate"] == pytest.approx(1 / 3)
    assert curves.loc[("fullkv", 5), "detection_rate"] == 0.0
    # deco: two finished tasks (the failed one does not count), one never detected
    assert curves.loc[("deco", 3), "mean_similarity"] == pytest.approx(0.3 / 2)
    assert (curves.loc["deco", "n_tasks"] == 2).all() and len(curves) == 2 * CONTINUATION


def test_records_without_per_frame_fields_still_render(made_runs):
    tmp, _, full, deco = made_runs
    rows = [json.loads(line) for line in (full / "records.jsonl").read_text().splitlines()]
    for key in ("similarities", "boxes", "detection_rate"):
        rows[0].pop(key)  # an older record schema, mixed with newer records in one run
    rows[1].update(best_frame=4, best_box=[0.5, 0.5, 1.0, 1.0])  # the record's own best frame wins
    (full / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp / "report"
    text = build_report([full, deco], out).index.read_text()
    card = re.search(r'<article class="task" id="task-syn_a_reappear_01".*?</article>', text, re.DOTALL).group(0)
    fullkv = re.search(r'data-method="fullkv".*?</figure>', card, re.DOTALL).group(0)
    assert "score <span class=\"score\">0.9000</span>" in fullkv
    assert "never detected · detected in — of frames" in fullkv and "_best.png" in fullkv
    card = re.search(r'<article class="task" id="task-syn_a_revisit_01".*?</article>', text, re.DOTALL).group(0)
    fullkv = re.search(r'data-method="fullkv".*?</figure>', card, re.DOTALL).group(0)
    assert "best frame 4" in fullkv  # not the argmax of its similarities (frame 2)
    best = np.asarray(Image.open(out / re.search(r'src="([^"]+_best\.png)"', fullkv).group(1)).convert("RGB"))
    assert tuple(best[64, 64 + 20]) == gallery.DETECTION_COLOUR and tuple(best[32, 32 + 40]) != gallery.DETECTION_COLOUR


def test_score_folders_are_reported_beside_runs(made_runs):
    tmp, data, full, _ = made_runs
    elsewhere = tmp / "other_generator"  # `score` records name the video file they read: in the folder
    scored = elsewhere / "scores_light"  # the score folder sits in (its default place) or inside it
    rows = []
    for i, task_id in enumerate(["syn_a_reappear_01", "syn_a_revisit_01", "real_b_reappear_01"]):
        video = elsewhere / f"{task_id}.mp4"
        write_video(video, continuation_frames(i), 16.0)
        row = record("other_gen", task_id, "a" if task_id.startswith("syn") else "b", 0.5, 1, kind="score",
                     seed=None, video=str(video))
        rows.append({k: v for k, v in row.items() if k not in ("pr", "context_pr", "peak_kv_bytes", "method")})
    scored.mkdir()
    (scored / "config.yaml").write_text(f"data:\n  name: official\n  root: {data}\n  manifest: metadata.jsonl\n"
                                        f"videos: {elsewhere}\n")
    (scored / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = build_report([full, scored], tmp / "report").index.read_text()
    assert [r["method"] for r in table_rows(text, "leaderboard")] == ["fullkv", "other_gen"]
    assert text.count('data-method="other_gen" data-status="ok">\n        <div class="pair">') == 3
    assert_self_contained(tmp / "report" / "index.html")


def test_bad_inputs_name_the_file_and_what_to_do(made_runs):
    tmp, data, full, deco = made_runs
    moved = tmp / "moved"
    shutil.move(data, moved)
    with pytest.raises(ReportError, match=r"metadata\.jsonl is not there.*data_root=DIR"):
        build_report([full, deco], tmp / "report")
    assert build_report([full, deco], tmp / "report", data_root=moved).tasks == 3
    write_manifest(moved, [official_row("syn_a_reappear_01", "videos/synthetic/a.mp4")])
    with pytest.raises(ReportError, match=r"fullkv: records of tasks not in .*metadata\.jsonl: \['real_b_reappear_01'"):
        build_report([full, deco], tmp / "report", data_root=moved)
    with pytest.raises(ReportError, match="share a method label"):
        build_report([full, full], tmp / "report", data_root=moved)


# ---------------------------------------------------------------- a real run, in a real browser


def browser_available() -> bool:
    return shutil.which("chromium") is not None and shutil.which("chromedriver") is not None


@pytest.fixture(scope="module")
def real_report(tmp_path_factory):
    if not browser_available():
        if os.environ.get("CMBENCH_REQUIRE_BROWSER"):
            pytest.fail("chromium / chromedriver missing although CMBENCH_REQUIRE_BROWSER is set (see .ci/run)")
        pytest.skip("needs Debian's chromium and chromium-driver (apt-get install -y chromium chromium-driver)")
    tmp = tmp_path_factory.mktemp("report")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    common = [f"out_dir={tmp / 'runs'}", "progress=false"]
    # the runs are this test's data, made in this process (python -m cmbench run's own real-process tests are
    # tests/test_run_command.py's); the report is what is tested, by the command line in a real process
    assert main(["run", "-m", "method=fullkv,streaming", f"data.root={tmp / 'suite'}", *SMALL_SUITE, *common]) == 0
    shot = tmp / "cli_screenshot.png"
    made = subprocess.run([sys.executable, "-m", "cmbench", "report", *common, f"report.screenshot={shot}",
                           "report.screenshot_method=streaming"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    assert "report: 2 methods x 4 tasks" in made.stdout
    width, height = Image.open(shot).size
    assert width == 1400 and 1000 < height <= 1800
    return tmp / "runs" / "miniworld" / "report" / "index.html"


def column(driver, table: str, key: str = "method") -> list[str]:
    """The shown texts of one column of a table, top to bottom."""
    from selenium.webdriver.common.by import By

    keys = [th.get_attribute("data-key") for th in driver.find_elements(By.CSS_SELECTOR, f'table[data-table="{table}"] th')]
    return [row.find_elements(By.CSS_SELECTOR, "td")[keys.index(key)].text
            for row in driver.find_elements(By.CSS_SELECTOR, f'table[data-table="{table}"] tbody tr')]


def click_header(driver, table: str, key: str) -> None:
    from selenium.webdriver.common.by import By

    driver.find_element(By.CSS_SELECTOR, f'table[data-table="{table}"] th[data-key="{key}"] button').click()


def choose(driver, select_id: str, value: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element(By.ID, select_id)).select_by_value(value)


@pytest.mark.slow
def test_real_report_in_headless_chromium(real_report, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from cmbench.report.browser import driven_page

    images = assert_self_contained(real_report)
    assert len(images) == 2 + 4 + 2 * 4 * 2
    with driven_page(real_report, offline=True) as driver:
        WebDriverWait(driver, 30).until(lambda d: d.execute_script("return document.readyState") == "complete")
        assert driver.title == "CMBench report"
        # at 1400 px the leaderboard fits the window and nothing makes the page scroll sideways
        width = driver.execute_script("return document.documentElement.clientWidth")
        assert width <= 1400 and driver.execute_script("return document.documentElement.scrollWidth") <= width
        assert driver.execute_script('return document.querySelector(\'table[data-table="leaderboard"]\')'
                                     '.getBoundingClientRect().right') <= width

        # the leaderboard: one row per method, by score; sorting by a column reorders it
        assert column(driver, "leaderboard") == ["fullkv", "streaming"]
        click_header(driver, "leaderboard", "pr")
        assert column(driver, "leaderboard") == ["fullkv", "streaming"]  # 0% < 92%
        click_header(driver, "leaderboard", "pr")
        assert column(driver, "leaderboard") == ["streaming", "fullkv"]
        assert column(driver, "leaderboard", "metric") == ["light", "light"]
        click_header(driver, "by-source", "source")
        assert column(driver, "by-source", "source") == ["real", "real", "synthetic", "synthetic"]
        click_header(driver, "by-source", "source")
        assert column(driver, "by-source", "source") == ["synthetic", "synthetic", "real", "real"]

        # filters: source, task type, method
        tasks = lambda: [a.get_attribute("id") for a in driver.find_elements(By.CSS_SELECTOR, "article.task")  # noqa: E731
                         if a.is_displayed()]
        assert len(tasks()) == 4
        choose(driver, "filter-source", "real")
        assert tasks() == ["task-real_001_reappear_01"]
        assert driver.find_element(By.ID, "shown-count").text == "1 of 4 tasks"
        choose(driver, "filter-source", "")
        choose(driver, "filter-type", "revisit")
        assert tasks() == ["task-syn_001_revisit_01"]
        choose(driver, "filter-type", "")
        panel = driver.find_element(By.CSS_SELECTOR, 'section.losses[data-method="streaming"]')
        assert not panel.is_displayed()
        driver.find_element(By.CSS_SELECTOR, 'table[data-table="leaderboard"] a[href="#method=streaming"]').click()
        WebDriverWait(driver, 10).until(lambda d: panel.is_displayed())  # a method's name opens its view
        assert driver.find_element(By.ID, "filter-method").get_attribute("value") == "streaming"
        choose(driver, "filter-method", "")
        assert not panel.is_displayed()
        choose(driver, "filter-method", "streaming")
        assert panel.is_displayed() and len(panel.find_elements(By.CSS_SELECTOR, "tbody tr")) == 4
        shown = {c.get_attribute("data-method") for c in driver.find_elements(By.CSS_SELECTOR, "figure.method")
                 if c.is_displayed()}
        assert shown == {"streaming", "fullkv"}  # the method beside the reference it is compared with
        choose(driver, "filter-method", "fullkv")
        shown = {c.get_attribute("data-method") for c in driver.find_elements(By.CSS_SELECTOR, "figure.method")
                 if c.is_displayed()}
        assert shown == {"fullkv"} and not panel.is_displayed()
        choose(driver, "filter-method", "")

        # every image loads (lazy ones forced), with the network off
        driver.execute_script("document.querySelectorAll('img').forEach(i => { i.loading = 'eager'; });")
        WebDriverWait(driver, 30).until(lambda d: d.execute_script(
            "return Array.from(document.images).every(i => i.complete);"))
        broken = driver.execute_script(
            "return Array.from(document.images).filter(i => i.naturalWidth === 0).map(i => i.src);")
        assert broken == []
        assert driver.execute_script("return document.images.length;") == len(images)

        console = driver.get_log("browser")
        assert [e for e in console if e["level"] == "SEVERE"] == [], console
        requests = [json.loads(e["message"])["message"] for e in driver.get_log("performance")]
        page = real_report.resolve().as_uri()
        urls = {m["params"]["request"]["url"] for m in requests
                if m["method"] == "Network.requestWillBeSent" and m["params"].get("documentURL") == page}
        assert len(urls) == 1 + len(images) and all(u.startswith("file://") for u in urls), sorted(urls)

        shot = Path(os.environ.get("CMBENCH_REPORT_SCREENSHOT", tmp_path / "report.png"))
        driver.find_element(By.ID, "gallery").location_once_scrolled_into_view  # noqa: B018
        assert driver.save_screenshot(str(shot)) and Image.open(shot).size[0] > 0


def test_report_page_has_a_header_for_every_leaderboard_column(made_runs):
    tmp, data, full, deco = made_runs
    text = build_report([full, deco], tmp / "report").index.read_text()
    main, more = (re.findall(r'data-key="([^"]+)"', re.search(rf'data-table="{t}".*?</thead>', text, re.DOTALL).group(0))
                  for t in ("leaderboard", "leaderboard-more"))
    columns = list(html.leaderboard(html.load_runs([full, deco])).columns)
    assert main[0] == more[0] == "method" and set(main) <= set(html.HEADLINE)
    assert set(main + more[1:]) - {"ranked"} == set(columns) and len(main + more[1:]) == len(set(main + more[1:]))


def test_report_shows_the_leaderboards_paired_comparisons(made_runs):
    tmp, data, full, deco = made_runs
    mine = write_run(tmp / "runs", "mine", data, [  # a plug-in method: its records carry its code's hash
        record("mine", "syn_a_reappear_01", "a", 0.5, 3, pr=0.85, code={"method": "c0ffee"}),
        record("mine", "syn_a_revisit_01", "a", 0.4, 2, pr=0.85, code={"method": "c0ffee"}),
        record("mine", "real_b_reappear_01", "b", 0.6, 4, pr=0.85, code={"method": "c0ffee"}),
    ])
    runs, compare = [full, deco, mine], [["deco", "fullkv"]]
    text = build_report(runs, tmp / "report", focus=["mine"], compare=compare).index.read_text()
    shown = table_rows(text, "comparisons")
    board = tmp / "board"
    write_reports(runs, board, focus=["mine"], compare=compare)
    csv = pd.read_csv(board / "comparisons.csv")
    # the leaderboard's rows, in its order: the focus against every other entry, then the named pair
    assert [(r["method"], r["versus"]) for r in shown] == list(zip(csv["method"], csv["versus"])) == [
        ("mine", "fullkv"), ("mine", "deco"), ("deco", "fullkv")]
    for row, expected in zip(shown, csv.to_dict("records")):
        for column, value in expected.items():
            assert row[column] == format_value(column, value).text, (column, row)
    assert [(r["pr"], r["versus_pr"]) for r in shown] == [("85.00%", "0.00%"), ("85.00%", "90.00%"),
                                                          ("90.00%", "0.00%")]
    # mine - fullkv: -0.4, -0.4, -0.1; mine - deco over the two tasks deco finished: +0.2, +0.4
    assert [(r["delta"], r["wins"], r["ties"], r["losses"], r["n_pairs"]) for r in shown] == [
        ("-0.3000", "0", "0", "3", "3"), ("0.3000", "2", "0", "0", "2"), ("-0.7000", "0", "0", "2", "2")]
    head = re.search(r'data-table="comparisons".*?</thead>', text, re.DOTALL).group(0)
    assert ">Versus<" in head and ">Δ score<" in head and ">Versus PR<" in head
    # no focus and no pair named: the section says there is nothing to compare
    plain = build_report([full, deco], tmp / "plain", focus=[]).index.read_text()
    section = re.search(r'<section class="table-block" id="comparisons">.*?</section>', plain, re.DOTALL).group(0)
    assert "No rows." in section


def test_gallery_of_a_seed_sweep_shows_each_record_with_its_own_video(made_runs):
    """An entry made of several seeds' runs shows one seed in the gallery (its lowest), and each
    shown record's continuation is read from the run folder that record came from."""
    tmp, data, _, _ = made_runs
    tasks = [("syn_a_reappear_01", "a"), ("syn_a_revisit_01", "a"), ("real_b_reappear_01", "b")]
    runs = []
    for label, seed, score, best, colour_seed in (("deco", 3, 0.6, 1, 5), ("deco", 2, 0.3, 3, 0),
                                                  ("fullkv", 2, 0.9, 2, 0), ("fullkv", 3, 0.8, 2, 5)):
        rows = [record(label, t, c, score, best, seed=seed, run_seed=seed, setup_hash=f"setup-{label}",
                       code_hash="code1") for t, c in tasks]
        run = write_run(tmp / "seeds", f"{label}_seed{seed}", data, rows, lossless=True)
        for r in rows:  # each seed's own continuation: its square has its own colour
            write_lossless_video(run / r["video"], continuation_frames(colour_seed), 16.0)
        runs.append(run)  # deco's later seed first
    out = tmp / "report"
    text = build_report(runs, out).index.read_text()
    assert [(r["method"], r["score"]) for r in table_rows(text, "leaderboard")] == [("fullkv", "0.8500"), ("deco", "0.4500")]
    card = re.search(r'<article class="task" id="task-syn_a_reappear_01".*?</article>', text, re.DOTALL).group(0)
    deco = re.search(r'data-method="deco".*?</figure>', card, re.DOTALL).group(0)
    assert "score <span class=\"score\">0.3000</span>" in deco and "best frame 3" in deco and "seed 2" in deco
    first = np.asarray(Image.open(out / re.search(r'src="([^"]+\.webp)"', deco).group(1)).convert("RGB"))
    assert tuple(first[5, 3]) == (200, 40, 40)  # seed 2's video (seed 3's square is (200, 190, 40))
    fullkv = re.search(r'data-method="fullkv".*?</figure>', card, re.DOTALL).group(0)
    assert "score <span class=\"score\">0.9000</span>" in fullkv and "seed 2" in fullkv
    # where deco loses most: one row per task, the mean paired drop over the seeds both ran
    panel = re.search(r'<section class="losses" data-method="deco".*?</section>', text, re.DOTALL).group(0)
    assert re.findall(r'href="#task-([^"]+)"', panel) == ["real_b_reappear_01", "syn_a_reappear_01", "syn_a_revisit_01"]
    assert "+0.4000" in panel and "0.8500" in panel and "0.4500" in panel  # (0.9 - 0.3 + 0.8 - 0.6) / 2
    assert "mean over the 2 seeds" in panel
    one_seed = build_report([runs[1]], tmp / "one").index.read_text()
    assert "seed 2" not in one_seed  # a one-seed entry needs no seed note


def test_markup_in_any_record_field_is_shown_as_text(made_runs):
    """Records come from other people's runs: a label or an error holding HTML is escaped, never rendered."""
    tmp, data, full, deco = made_runs
    rows = [json.loads(line) for line in (deco / "records.jsonl").read_text().splitlines()]
    rows[-1]["error"] = "RuntimeError: <img src=x onerror=alert(1)> & <b>bold</b>"
    (deco / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = build_report([full, deco], tmp / "report").index.read_text()
    assert "<img src=x onerror" not in text and "<b>bold</b>" not in text
    assert "&lt;img src=x onerror=alert(1)&gt; &amp; &lt;b&gt;bold&lt;/b&gt;" in text


def test_the_board_shows_kv_bytes_over_fullkvs_and_the_fidelity_columns_that_have_values(made_runs, monkeypatch):
    tmp, data, full, deco = made_runs
    original = html.leaderboard

    def with_bytes_and_fidelity(runs, *curves):  # FullKV first (score 0.8), then deco
        return original(runs, *curves).assign(kv_bytes_ratio=[1.0, 0.125], psnr_vs_fullkv=[math.inf, 31.236],
                                              ssim_vs_fullkv=[1.0, 0.8125], last_frame_psnr_vs_fullkv=[math.inf, 24.5],
                                              last_frame_ssim_vs_fullkv=[math.nan, math.nan])

    monkeypatch.setattr(html, "leaderboard", with_bytes_and_fidelity)
    text = build_report([full, deco], tmp / "report").index.read_text()
    board = [{**a, **b} for a, b in zip(table_rows(text, "leaderboard"), table_rows(text, "leaderboard-more"))]
    shown = [(r["method"], r["kv_bytes_ratio"], r["psnr_vs_fullkv"], r["ssim_vs_fullkv"], r["last_frame_psnr_vs_fullkv"])
             for r in board]
    assert shown == [("fullkv", "100.00%", "∞", "1.0000", "∞"), ("deco", "12.50%", "31.24", "0.8125", "24.50")]
    main, more = (re.search(rf'data-table="{t}".*?</table>', text, re.DOTALL).group(0) for t in ("leaderboard", "leaderboard-more"))
    assert ">KV bytes / FullKV<" in main and ">PSNR vs FullKV (dB)<" in more and ">Last-frame PSNR vs FullKV (dB)<" in more
    assert "last_frame_ssim_vs_fullkv" not in main + more  # no entry has a value: not shown
