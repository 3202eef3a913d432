"""What a run is called and which params it has (mxlarge/tracking/naming.py)."""
from mxlarge import tracking
from mxlarge.config import load_config
from mxlarge.plan import plan_for

BASELINE = "experiments/proxy/digits-baseline.yaml"
LARGEBATCH = "experiments/proxy/digits-largebatch.yaml"
MNIST1D = "experiments/proxy/mnist1d-recipe.yaml"
# what only a store exchanging between processes (or a process's devices) reads
DIST_ONLY = ("dist.servers", "dist.server_hosts", "dist.check_every", "dist.wire_dtype",
             "dist.compression", "dist.compression_threshold")
STORE = ("dist.fusion_bytes", "net.params_pushed", "net.params_pushed_elements")
NET = {"params_pushed": 20, "params_pushed_elements": 9000, "params_local_stats": 8,
       "params_no_decay": 12, "zero_gamma_blocks": 2}


def _params(path, overrides=()):
    cfg = load_config(path, list(overrides))
    params = tracking.run_params(cfg, "sqlite:///x.db", plan_for(cfg))
    params.update({f"net.{k}": str(v) for k, v in NET.items()
                   if tracking.takes_effect(f"net.{k}", v, cfg)})
    return params


def test_a_one_process_run_has_no_dist_params():
    """A local store on one CPU device (`mxlarge train`, a sweep's local children): no dist.*
    param at all (servers, replica checks, wire type, fusion, BN statistics to choose from, the
    store, the world), its world is the plan's; pushed tensors neither."""
    for overrides in ((), ("dist.servers=1",), ("dist.check_every=10", "dist.fusion_bytes=0")):
        params = _params(BASELINE, overrides)
        assert not [k for k in params if k.startswith("dist.")], (overrides, sorted(params))
        assert not set(STORE) & set(params)
        assert (params["plan.workers"], params["plan.devices_per_worker"],
                params["plan.simulated_workers"]) == ("1", "1", "1")
        assert params["net.zero_gamma_blocks"] == "2"
    assert _params(BASELINE, ["dist.device_type=gpu"])["dist.device_type"] == "gpu"


def test_simulated_workers_or_devices_keep_what_they_read():
    sim = _params(MNIST1D, ["dist.simulate_workers=4"])
    assert sim["dist.bn_stats"] == "reduce"  # 4 sets of statistics: the mean is evaluated
    assert sim["dist.simulate_workers"] == "4"
    assert not {*DIST_ONLY, *STORE, "dist.kvstore"} & set(sim)
    devices = _params(BASELINE, ["dist.devices=2"])
    assert {"dist.bn_stats", "dist.kvstore", "dist.devices", *STORE} <= set(devices)
    assert not set(DIST_ONLY) & set(devices)


def test_a_dist_run_has_the_store_params():
    params = _params(LARGEBATCH)
    assert params["dist.kvstore"] == "dist_sync" and params["dist.servers"] == "1"
    assert params["dist.workers"] == "2" and params["dist.device_type"] == "cpu"
    assert "dist.simulate_workers" not in params  # 1: none simulated
    for key in ("dist.check_every", "dist.wire_dtype", "dist.compression", "dist.bn_stats",
                *STORE):
        assert key in params, key
    assert "dist.compression_threshold" not in params  # no compression
    assert "dist.compression_threshold" in _params(LARGEBATCH, ["dist.compression=2bit"])


def _name(path, overrides=(), label=None, written=True):
    cfg = load_config(path, list(overrides))
    return tracking.run_name(cfg, plan_for(cfg).world, label,
                             tracking.as_written(path) if written else None)


def test_run_names_say_what_differs_first_and_short():
    """The config's name, then what an override changed in the world or the schedule, then
    the seed; the runs list shows about 20 characters."""
    assert _name(LARGEBATCH) == "digits-largebatch s0"
    short = ["train.epochs=8", "optim.decay_epochs=[6]"]
    assert _name(LARGEBATCH, short) == "digits-largebatch 8ep s0"
    assert _name(LARGEBATCH, [*short, "dist.workers=4", "train.seed=3"]) == \
        "digits-largebatch 4×128 8ep s3"
    assert _name(BASELINE, ["optim.base_lr=0.1", "train.max_steps=90"]) == \
        "digits-baseline 90steps lr0.1 s0"
    assert _name(BASELINE, ["train.log_every=5"]) == "digits-baseline s0"  # not the schedule
    # a sweep's label names the run; without a file, the world and the epochs
    assert _name(MNIST1D, ["dist.simulate_workers=16", "train.seed=2"], "16x recipe") == \
        "16x recipe 16×32 s2"
    assert _name(LARGEBATCH, written=False) == "digits-largebatch 2×128 30ep s0"
    # two launches of one config that differ in epochs or seed differ within 20 characters
    names = [_name(LARGEBATCH), _name(LARGEBATCH, short), _name(LARGEBATCH, ["train.seed=1"])]
    assert len({n[:20] for n in names}) == 3, names


def test_run_names_are_unique_in_the_experiment(mlflow_uri):
    c = tracking.client(mlflow_uri)
    made = []
    for overrides in ([], [], ["train.epochs=8", "optim.decay_epochs=[6]"], []):
        cfg = load_config(LARGEBATCH, overrides)
        run = tracking.RunHandle.create(cfg, mlflow_uri, source=LARGEBATCH)
        made.append(c.get_run(run.run_id).data.tags["mlflow.runName"])
    assert made == ["digits-largebatch s0", "digits-largebatch s0 #2",
                    "digits-largebatch 8ep s0", "digits-largebatch s0 #3"]
    other = tracking.RunHandle.create(load_config(LARGEBATCH, []), mlflow_uri,
                                      source=LARGEBATCH, tags={"sweep_label": "digits"})
    assert c.get_run(other.run_id).data.tags["mlflow.runName"] == "digits s0"


def test_a_label_that_says_the_world_is_not_followed_by_it_again():
    """The noise-scale sweep's cells: the label states K and n, so the name says the world once;
    a label that states only K (or neither) still gets ``K×n``."""
    noise = ["data.batch_size=16", "dist.kvstore=local", "dist.workers=1", "train.seed=0"]
    assert _name(LARGEBATCH, [*noise, "dist.simulate_workers=16"], "16x (16 workers x 16)") == \
        "16x (16 workers x 16) s0"
    assert _name(LARGEBATCH, [*noise, "dist.simulate_workers=4"], "4x (4 workers x 16)") == \
        "4x (4 workers x 16) s0"
    assert _name(LARGEBATCH, [*noise, "dist.simulate_workers=16"], "16x recipe") == \
        "16x recipe 16×16 s0"  # n not said
    assert _name(LARGEBATCH, [*noise, "dist.simulate_workers=16"], "16 workers x 32") == \
        "16 workers x 32 16×16 s0"  # another world than the one run: both shown
    assert _name(BASELINE, ["data.batch_size=128"], "big") == "big 1×128 s0"
