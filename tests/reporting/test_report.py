"""The report's arithmetic on hand-made run histories, with closed-form expectations."""
import dataclasses
import math

import numpy as np
import pytest

from mxlarge.reporting.plots import (
    compare_panels,
    plot_compare,
    plot_error_vs_batch,
    plot_loss_lr,
    plot_val_error,
)
from mxlarge.reporting.runs import RunData, config_fingerprint, epoch_rows, select_runs
from mxlarge.reporting.summary import (
    all_reached,
    convergence_speedup,
    epoch_median,
    mean_curve,
    mean_std,
    run_final_error,
    scaling,
    summarize,
    time_to_target,
)
from mxlarge.reporting.tables import (
    description_table,
    markdown_table,
    parent_description,
    render_markdown,
)
from mxlarge.stats import final_error

PARAMS = {"data.batch_size": "32", "optim.base_lr": "0.1", "dist.workers": "1",
          "dist.kvstore": "local", "train.seed": "0", "name": "x", "tracking.uri": "None"}


def rows(acc, seconds=None, ips=None, err=None):
    """Per-epoch rows: epoch e (1-based) at step 10·e."""
    out = []
    for i, a in enumerate(acc):
        r = {"train/epoch": float(i + 1), "step": float(10 * (i + 1))}
        if a is not None:
            r["val/accuracy"] = a
            r["val/error_top1"] = 1 - a if err is None else err[i]
        if seconds is not None:
            r["perf/train_seconds"] = seconds[i]
        if ips is not None:
            r["perf/images_per_sec"] = ips[i]
        out.append(r)
    return tuple(out)


def run(label, seed, acc, seconds=None, ips=None, world=1, batch=32, params=None, t=0,
        status="FINISHED", run_id=None):
    p = dict(PARAMS if params is None else params)
    return RunData(run_id=run_id or f"{label}-{seed}-{t}".ljust(32, "0"), label=label, seed=seed,
                   status=status, start_time=t, workers=world, global_batch=batch,
                   peak_lr=0.1, fingerprint=config_fingerprint(p),
                   rows=rows(acc, seconds, ips) if status == "FINISHED" else ())


def test_epoch_rows_join_epoch_metrics_by_step_and_skip_unevaluated_epochs():
    hist = {"train/epoch": [(10, 1.0), (20, 2.0), (30, 3.0)],
            "val/accuracy": [(10, 0.5), (30, 0.7)],          # eval_every = 2 (+ last epoch)
            "perf/train_seconds": [(10, 1.5), (20, 3.0), (30, 4.5)]}
    got = epoch_rows(hist)
    assert got == [
        {"step": 10.0, "train/epoch": 1.0, "val/accuracy": 0.5, "perf/train_seconds": 1.5},
        {"step": 20.0, "train/epoch": 2.0, "perf/train_seconds": 3.0},
        {"step": 30.0, "train/epoch": 3.0, "val/accuracy": 0.7, "perf/train_seconds": 4.5}]
    assert epoch_rows({}) == []


def test_final_error_is_the_median_of_the_last_five_epochs():
    r = rows([None] * 7)
    errors = [0.5, 0.4, 0.3, 0.2, 0.1, 0.3, 0.2]
    r = tuple({**x, "val/error_top1": e} for x, e in zip(r, errors))
    assert run_final_error(r) == pytest.approx(0.2)          # median(.3,.2,.1,.3,.2)
    assert final_error(errors) == pytest.approx(0.2)         # unchanged public function


def test_final_error_with_fewer_than_five_epochs_uses_all_and_none_without_evaluations():
    r = tuple({"train/epoch": float(i), "val/error_top1": e} for i, e in enumerate([0.4, 0.2, 0.3]))
    assert run_final_error(r) == pytest.approx(0.3)
    assert run_final_error(r[:2]) == pytest.approx(0.3)      # median of two = their mean
    assert run_final_error(rows([None, None])) is None


def test_mean_std_is_the_sample_standard_deviation():
    mean, std = mean_std([1.0, 2.0, 3.0])
    assert mean == 2.0 and std == pytest.approx(1.0)         # population would be 0.8165
    assert mean_std([4.0]) == (4.0, None)
    with pytest.raises(ValueError):
        mean_std([])


def test_time_to_target_is_the_first_epoch_reaching_it_without_interpolation():
    r = rows([0.5, 0.8, 0.79, 0.95], seconds=[10.0, 20.0, 30.0, 40.0])
    assert time_to_target(r, 0.8) == (2.0, 20.0)             # >= counts; a later dip is ignored
    assert time_to_target(r, 0.9) == (4.0, 40.0)             # 0.9 lies between 0.79 and 0.95
    assert time_to_target(r, 0.96) is None                   # never reached
    assert time_to_target(rows([0.9]), 0.5) == (1.0, None)   # no train_seconds logged


def test_time_to_target_skips_epochs_without_evaluation():
    r = rows([None, 0.9], seconds=[5.0, 9.0])
    assert time_to_target(r, 0.1) == (2.0, 9.0)


def test_throughput_scaling_and_convergence_speedup():
    assert epoch_median(rows([0.1] * 4, ips=[100, 300, 200, 1000]), "perf/images_per_sec") == 250
    assert epoch_median(rows([0.1]), "perf/images_per_sec") is None
    speedup, eff = scaling(1800.0, 1000.0, 2)
    assert speedup == pytest.approx(1.8) and eff == pytest.approx(0.9)
    assert convergence_speedup(100.0, 40.0) == pytest.approx(2.5)
    assert convergence_speedup(None, 40.0) is None and convergence_speedup(100.0, None) is None


def test_all_reached_refuses_a_partial_mean():
    assert all_reached([10.0, None]) is None
    assert all_reached([]) is None
    mean, std = all_reached([10.0, 20.0])
    assert mean == 15.0 and std == pytest.approx(math.sqrt(50.0))


def test_mean_curve_averages_over_the_epochs_every_seed_has():
    assert mean_curve([[(1, 2.0), (2, 4.0), (3, 6.0)], [(1, 4.0), (2, 8.0)]]) == [(1, 3.0),
                                                                                  (2, 6.0)]
    assert mean_curve([]) == []


def test_config_fingerprint_ignores_world_size_seed_and_logging_only():
    other_k = {**PARAMS, "dist.workers": "4", "dist.kvstore": "dist_sync", "train.seed": "3",
               "name": "y", "tracking.uri": "sqlite:///a.db"}
    assert config_fingerprint(other_k) == config_fingerprint(PARAMS)
    assert config_fingerprint({**PARAMS, "data.batch_size": "64"}) != config_fingerprint(PARAMS)
    # simulated workers and what only several units read are the world too; the device is not
    simulated = {**PARAMS, "dist.simulate_workers": "16", "dist.bn_stats": "reduce"}
    assert config_fingerprint(simulated) == config_fingerprint(PARAMS)
    assert config_fingerprint({**PARAMS, "dist.device_type": "cpu"}) == \
        config_fingerprint(PARAMS)
    assert config_fingerprint({**PARAMS, "dist.device_type": "gpu"}) != \
        config_fingerprint(PARAMS)


def test_select_runs_keeps_the_newest_finished_run_per_seed_and_names_the_rest():
    old = run("a", 0, [0.5], t=1)
    new = run("a", 0, [0.6], t=3)
    failed_then_ok = run("a", 1, [0.1], t=2, status="FAILED")
    ok = run("a", 1, [0.7], t=4)
    only_failed = run("b", 0, [0.1], t=5, status="FAILED")
    used, notes = select_runs([old, new, failed_then_ok, ok, only_failed])
    assert used == [new, ok]
    assert len(notes) == 3
    assert any(old.run_id[:8] in n and "superseded" in n for n in notes)
    assert any(only_failed.run_id[:8] in n and "no FINISHED run" in n for n in notes)


def scaling_sweep():
    """a: 1 worker (reference); b: same config on 2 workers; c: another config, on 2 workers only;
    d: a 1-worker label whose seed 1 never reaches the target; e: reaches it never."""
    other = {**PARAMS, "data.batch_size": "64"}
    return [
        run("a", 0, [0.6, 0.95, 1.0], seconds=[10, 20, 30], ips=[100, 100, 100], t=0),
        run("a", 1, [0.5, 0.99, 0.99], seconds=[12, 24, 36], ips=[100, 120, 80], t=1),
        run("b", 0, [0.7, 0.99, 0.99], seconds=[6, 12, 18], ips=[180, 180, 180], world=2,
            batch=64, t=2),
        run("b", 1, [0.8, 0.99, 0.99], seconds=[5, 10, 15], ips=[180, 180, 180], world=2,
            batch=64, t=3),
        run("c", 0, [0.99, 0.99], seconds=[1, 2], ips=[500, 500], world=2, batch=128,
            params=other, t=4),
        run("d", 0, [0.99], seconds=[3], ips=[50], params=other | {"optim.base_lr": "0.2"},
            t=5),
        run("d", 1, [0.2], seconds=[3], ips=[50], params=other | {"optim.base_lr": "0.2"},
            t=6),
        run("e", 0, [0.1, 0.2], seconds=[3, 6], ips=[10, 10], t=7,
            params=other | {"optim.base_lr": "0.3"}),
    ]


def test_summarize_target_speedup_efficiency_and_convergence_speedup():
    s = summarize(scaling_sweep(), 0.99)
    assert s.best_accuracy == 1.0 and s.target == pytest.approx(0.99)
    by = {r.label: r for r in s.rows}
    a, b, c, d, e = (by[k] for k in "abcde")
    assert [r.label for r in s.rows] == list("abcde")
    # a: target 0.99 first reached at epoch 3 (seed 0: 30 s) and epoch 2 (seed 1: 24 s)
    assert a.epochs_to_target == (3.0, 2.0) and a.seconds_to_target == (30, 24)
    assert a.reference == "a" and a.speedup == pytest.approx(1.0)
    assert a.final_errors == pytest.approx((0.05, 0.01))      # median of 3 epochs each
    # b: same config on 2 workers: ips 180 vs mean(100, 100) = 100
    assert b.reference == "a"
    assert b.images_per_sec == pytest.approx(180.0)
    assert b.speedup == pytest.approx(1.8) and b.efficiency == pytest.approx(0.9)
    # time to target: a = mean(30, 24) = 27 s; b = mean(12, 10) = 11 s
    assert b.conv_speedup == pytest.approx(27 / 11)
    # c: the only label of its config: its own reference, at 2 workers
    assert c.reference == "c" and c.speedup == pytest.approx(1.0)
    # d: 1-worker, but seed 1 never reaches the target
    assert d.seconds_to_target == (3, None) and d.reference == "d"
    assert e.seconds_to_target == (None,)


def test_markdown_shows_not_reached_and_missing_reference_as_words():
    s = summarize(scaling_sweep(), 0.99, missing={"f": [0, 1]}, order=["f", "a"])
    table = markdown_table(s)
    lines = {line.split(" | ")[0].lstrip("| "): line for line in table.splitlines()[2:]}
    assert list(lines) == ["f", "a", "b", "c", "d", "e"]
    assert "| ref. | ref. | ref. |" in lines["c"]
    assert "1.80×" in lines["b"] and "90%" in lines["b"] and f"{27 / 11:.2f}×" in lines["b"]
    assert lines["d"].count("not reached by 1 of 2 seeds") == 2
    e_cells = [x.strip() for x in lines["e"].split("|")]
    assert e_cells[7:9] == ["not reached", "not reached"]
    assert "none FINISHED" in lines["f"] and "0,1" in lines["f"]
    assert "| 3.00 ± 2.83 |" in lines["a"]  # errors 5 % and 1 %: mean 3, sample std 2√2


def test_render_markdown_states_the_rules():
    runs = scaling_sweep()
    text = render_markdown("s", summarize(runs, 0.99), runs, ["run x left out"],
                           {"experiment": "mxlarge", "uri": "sqlite:///m.db"}, ["val_error.png"])
    assert "**sample** standard deviation" in text and "no interpolation" in text
    assert "![val_error](val_error.png)" in text and "- run x left out" in text


def test_summarize_without_any_accuracy_has_no_target():
    r = run("a", 0, [None, None], seconds=[1, 2], ips=[5, 5])
    s = summarize([r], 0.99)
    assert s.target is None and s.rows[0].epochs_to_target == (None,)
    assert "no target" in render_markdown("s", s, [r], [], {}, [])


def _pixels(path):
    from matplotlib.image import imread
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return imread(path)


def test_plots_draw_the_data(tmp_path):
    """Each plot is a PNG whose pixels are a function of the data: the same runs give the same
    image, and changing what the plot shows (one run's accuracy, or its LR) changes it."""
    runs = list(scaling_sweep())
    runs[0] = dataclasses.replace(runs[0], lr=((1, 0.1), (10, 0.2), (20, 0.02)))
    changed_acc = [dataclasses.replace(runs[0], rows=rows([0.2, 0.3, 0.4])), *runs[1:]]
    changed_lr = [dataclasses.replace(runs[0], lr=((1, 0.1), (10, 0.05), (20, 0.3))), *runs[1:]]
    for fn, variant in ((plot_val_error, changed_acc), (plot_error_vs_batch, changed_acc),
                        (plot_loss_lr, changed_lr)):
        a, again, other = (tmp_path / f"{fn.__name__}-{i}.png" for i in range(3))
        fn(runs, a, "t")
        fn(runs, again, "t")
        fn(variant, other, "t")
        img = _pixels(a)
        assert img.shape[0] > 100 and img.shape[1] > 100
        assert len(np.unique(img.reshape(-1, img.shape[-1]), axis=0)) > 10  # not blank
        np.testing.assert_array_equal(img, _pixels(again))
        assert not np.array_equal(img, _pixels(other)), fn.__name__


# -- gradient noise scale ---------------------------------------------------------------------

def test_noise_scale_stages_skip_the_start_and_take_thirds():
    from mxlarge.reporting.summary import noise_scale_stages
    # 10 wild first points (skipped: first 10% of 100), then thirds of 30 at 10, 20, 40
    pts = [(i, 5000.0) for i in range(10)] + [(10 + i, v) for i, v in
                                               enumerate([10.0] * 30 + [20.0] * 30 + [40.0] * 30)]
    assert noise_scale_stages(pts) == (10.0, 20.0, 40.0)
    assert noise_scale_stages([(0, 1.0), (1, 2.0)]) is None
    assert noise_scale_stages([(i, float("inf")) for i in range(20)]) is None


def test_noise_scale_verdicts():
    from mxlarge.reporting.summary import FAR_ABOVE
    from mxlarge.reporting.tables import noise_scale_verdict
    assert noise_scale_verdict(16, (64.0, 100.0, 700.0)) == "below B_simple throughout"
    assert "above B_simple early/middle" in noise_scale_verdict(256, (64.0, 100.0, 700.0))
    far = noise_scale_verdict(int(FAR_ABOVE * 64) + 1, (64.0, 100.0, 700.0))
    assert far.startswith("far above") and "early" in far and "late" not in far


def test_noise_scale_section_in_markdown():
    from mxlarge.reporting.tables import noise_scale_markdown
    pts = tuple((i, 50.0) for i in range(40))
    runs = [RunData(run_id="a" * 32, label="16x", seed=0, global_batch=256, gns=pts),
            RunData(run_id="b" * 32, label="base", seed=0, global_batch=16)]
    text = "\n".join(noise_scale_markdown(runs))
    assert "## Gradient noise scale" in text
    assert "| 16x | 0 | 256 | 50 | 50 | 50 | above B_simple early/middle/late" in text
    assert "| base |" not in text  # no measurement, no row
    assert noise_scale_markdown(runs[1:]) == []


# -- the labels compared (the sweep parent's picture and table) -------------------------------

def test_compare_panels_hold_every_label_for_each_quantity():
    runs = scaling_sweep()
    s = summarize(runs, 0.99)
    names, values = zip(*compare_panels(s, runs))
    assert names == ("final error (%), mean ± std", "best accuracy (%)", "images/s (median)")
    errors, best, ips = ({r.label: v for r, v in zip(s.rows, panel)} for panel in values)
    # a: medians of (0.4, 0.05, 0.0) and (0.5, 0.01, 0.01); best 1.0; ips medians 100 and 100
    assert errors["a"] == pytest.approx([5.0, 1.0]) and best["a"] == [100.0]
    assert ips["a"] == [100.0] and ips["b"] == [180.0] and best["b"] == pytest.approx([99.0])
    assert errors["e"] == pytest.approx([85.0])  # medians of (0.9, 0.8)


def test_plot_compare_puts_every_label_on_each_panels_axis(monkeypatch, tmp_path):
    from mxlarge.reporting import plots

    figures = []
    monkeypatch.setattr(plots, "save", lambda fig, path, title="": figures.append(fig))
    runs = scaling_sweep()
    plot_compare(summarize(runs, 0.99), runs, tmp_path / "c.png")
    (fig,) = figures
    for ax in fig.axes:
        assert [t.get_text() for t in ax.get_xticklabels()] == list("abcde")
        # a bar per label at its mean: a's errors 5 and 1 %, best 100 %, images/s 100
        assert [round(p.get_height(), 6) for p in ax.patches][:1] in ([3.0], [100.0])


def test_plot_compare_draws_the_data(tmp_path):
    runs = scaling_sweep()
    changed = [dataclasses.replace(runs[0], rows=rows([0.2, 0.3, 0.4])), *runs[1:]]
    paths = [tmp_path / f"c{i}.png" for i in range(3)]
    for path, data in zip(paths, (runs, runs, changed)):
        plot_compare(summarize(data, 0.99), data, path, "t")
    img = _pixels(paths[0])
    assert len(np.unique(img.reshape(-1, img.shape[-1]), axis=0)) > 10
    np.testing.assert_array_equal(img, _pixels(paths[1]))
    assert not np.array_equal(img, _pixels(paths[2]))


def test_the_parent_description_shows_the_picture_then_a_table_that_fits():
    s = summarize(scaling_sweep(), 0.99)
    text = parent_description("s", s, [("compare: a, b", "c.png"), ("val error", "v.png")])
    table = description_table(s)
    picture = "![compare: a, b](c.png)\n*compare: a, b*"  # the caption the page shows
    assert text.index(picture) < text.index(table) < text.index("(v.png)\n*val error*")
    lines = table.splitlines()
    assert {line.count("|") for line in lines} == {7}  # six columns
    assert "| b | 2 | 64 | 1.00 ± 0.00 | 180 | 1.80× vs a |" in lines
    assert "| a | 1 | 32 | 3.00 ± 2.83 | 100 | ref. |" in lines
