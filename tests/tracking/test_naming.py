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


def test_a_one_process_run_has_no_store_params():
    """A local store on one device (`mxlarge train`, a sweep's local children): no servers,
    replica checks, wire type, fusion, pushed tensors, nor BN statistics to choose from."""
    for overrides in ((), ("dist.servers=1",), ("dist.check_every=10", "dist.fusion_bytes=0")):
        params = _params(BASELINE, overrides)
        assert params["dist.kvstore"] == "local"
        for key in (*DIST_ONLY, *STORE, "dist.bn_stats"):
            assert key not in params, (overrides, key)
        assert params["dist.workers"] == "1" and params["net.zero_gamma_blocks"] == "2"


def test_simulated_workers_or_devices_keep_what_they_read():
    sim = _params(MNIST1D, ["dist.simulate_workers=4"])
    assert sim["dist.bn_stats"] == "reduce"  # 4 sets of statistics: the mean is evaluated
    assert not {*DIST_ONLY, *STORE} & set(sim)
    devices = _params(BASELINE, ["dist.devices=2"])
    assert {"dist.bn_stats", *STORE} <= set(devices) and not set(DIST_ONLY) & set(devices)


def test_a_dist_run_has_the_store_params():
    params = _params(LARGEBATCH)
    assert params["dist.kvstore"] == "dist_sync" and params["dist.servers"] == "1"
    for key in ("dist.check_every", "dist.wire_dtype", "dist.compression", "dist.bn_stats",
                *STORE):
        assert key in params, key
    assert "dist.compression_threshold" not in params  # no compression
    assert "dist.compression_threshold" in _params(LARGEBATCH, ["dist.compression=2bit"])
