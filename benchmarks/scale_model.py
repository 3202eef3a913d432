r"""Benchmark 6: a bandwidth model of synchronous SGD on a parameter server, checked against
MXNet's published 1–256 GPU Inception-v3 scaling table.

Usage: ``python -m benchmarks.scale_model [benchmarks/scale_model.yaml]`` prints the comparison;
``benchmarks.run`` puts it in ``results/latest.md``. All parameters are in the YAML, with sources.

Notation (per training step): :math:`S` bytes of parameters (= of gradients), :math:`n` images
per device, :math:`x_1` images/s of one device alone, :math:`g` devices per machine, :math:`m`
machines (workers), :math:`s` servers, :math:`B` NIC bandwidth per direction (bytes/s, full
duplex, times an efficiency), :math:`B_i` intra-machine bandwidth of one device link shared by
:math:`L` devices, :math:`\beta` the backward share of the compute time, :math:`o` the fraction
of backward that can hide communication.

.. math::

    t_c = n / x_1, \qquad t_b = \beta\, t_c

**Intra-machine reduction** (MXNet ``device`` store, :math:`g \ge 2`): every key is summed on
one device and broadcast back, the keys spread over the devices, so each device sends and
receives :math:`S (g-1)/g` per phase over a link it shares with :math:`\min(L, g)` devices:

.. math:: t_\text{intra} = 2 \min(L, g)\, S\, \frac{g-1}{g} \Big/ B_i

**Parameter server** (:math:`m \ge 2`; with ``dist_device_sync`` each machine pushes its local
sum once): each of the :math:`s` servers holds :math:`S/s` (big arrays are sliced over all
servers), receives :math:`m` pushes of its slice and answers :math:`m` pulls of it; each worker
sends :math:`S` and receives :math:`S`. A key's pull cannot start before all :math:`m` pushes of
it are summed, so the step has a push phase and a pull phase (2×, no credit for pipelining keys
across phases). Per phase, the busiest NIC direction decides:

* dedicated server machines: worker NIC :math:`S`, server NIC :math:`m S / s`:

  .. math:: t_\text{ps} = 2 \max(S,\; m S / s) / B

  (one server, :math:`k` workers: :math:`2 k S / B`, all of it through one NIC);
* servers co-located with the workers (MXNet's ``launch.py`` default, and 2 per machine in
  its ``benchmark.py``): a machine's servers hold :math:`S/m`, so :math:`1/m` of its push stays
  local and it receives :math:`(m-1) S/m` of the others' pushes; likewise for pulls:

  .. math:: t_\text{ps} = 2 S \frac{m-1}{m} \Big/ B

**Per-key overhead** (revisited): each key costs one pushpull request and its
response on top of its bytes, :math:`k_\text{key}` seconds per key (measured on the testbed:
(demo net per key − fused) ÷ (20 − 1) keys, ``benchmarks/results/cluster``), for the :math:`K`
keys a step sends (ResNet-50's 161 tensors travel as 48 keys under mxlarge's default fusion):

.. math:: t_\text{keys} = K k_\text{key} \quad (m \ge 2)

:math:`B`'s efficiency is the measured one as well: the bound |g|/B ÷ the measured push+pull time
of ResNet-50's gradients, W = S = 2, 1 Gbit/s, on the testbed.

.. math::

    t_\text{comm} = t_\text{intra} + t_\text{ps} + t_\text{keys}, \qquad
    t(m, g) = t_c + \max(0,\; t_\text{comm} - o\, t_b)

    \text{images/s} = \frac{m g n}{t(m, g)}, \qquad
    \text{efficiency} = \frac{\text{images/s}}{m g x_1}

What it leaves out, on purpose: per-message latency, stragglers (a synchronous step waits for
the slowest of :math:`mg` devices), server CPU time, and imbalance when small arrays land on one
server. Their sum is what the comparison with the published table shows.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import BenchResult, Ratio, md_table

DEFAULT_YAML = Path(__file__).with_name("scale_model.yaml")


@dataclass(frozen=True)
class Params:
    """The YAML's numbers (see ``scale_model.yaml`` for their sources)."""

    params_bytes: float
    batch_per_device: int
    single_device_img_s: float
    backward_fraction: float
    devices_per_machine: int
    network_gbit_s: float
    network_efficiency: float
    intra_gbyte_s: float
    devices_per_link: int
    placement: str
    servers_per_machine: int
    dedicated_servers: int
    overlap: float
    published_gpus: tuple[int, ...]
    published_img_s: tuple[float, ...]
    name: str = "model"
    keys: int = 0
    tensors: int = 0
    per_key_s: float = 0.0

    @property
    def t_compute(self) -> float:
        return self.batch_per_device / self.single_device_img_s

    @property
    def net_bytes_s(self) -> float:
        return self.network_gbit_s * 1e9 / 8 * self.network_efficiency

    def replace(self, **kw: Any) -> Params:
        from dataclasses import replace
        return replace(self, **kw)


def load(path: str | Path = DEFAULT_YAML, model: str = "model") -> Params:
    """The YAML's ``model`` section (or another model section, e.g. ``resnet50``) on its
    cluster; ``revisited`` numbers (measured) are applied by :func:`revisited`."""
    import yaml

    with open(path) as f:
        y = yaml.safe_load(f)
    m, c, p = y[model], y["cluster"], y["published"]
    if c["placement"] not in ("colocated", "dedicated"):
        raise ValueError(f"{path}: cluster.placement = {c['placement']!r}: expected colocated "
                         "or dedicated")
    if len(p["gpus"]) != len(p["img_s"]):
        raise ValueError(f"{path}: published.gpus and published.img_s differ in length")
    return Params(
        name=str(m["name"]), params_bytes=float(m["params_bytes"]),
        batch_per_device=int(m["batch_per_device"]),
        single_device_img_s=float(m["single_device_img_s"]),
        backward_fraction=float(m["backward_fraction"]),
        devices_per_machine=int(c["devices_per_machine"]),
        network_gbit_s=float(c["network_gbit_s"]),
        network_efficiency=float(c["network_efficiency"]),
        intra_gbyte_s=float(c["intra_gbyte_s"]), devices_per_link=int(c["devices_per_link"]),
        placement=str(c["placement"]), servers_per_machine=int(c["servers_per_machine"]),
        dedicated_servers=int(c["dedicated_servers"]), overlap=float(c["overlap"]),
        published_gpus=tuple(int(g) for g in p["gpus"]),
        published_img_s=tuple(float(x) for x in p["img_s"]), keys=int(m.get("keys", 0)),
        tensors=int(m.get("tensors", 0)))


def revisited(p: Params, path: str | Path = DEFAULT_YAML) -> Params:
    """``p`` with the YAML's measured ``revisited`` numbers: NIC efficiency and per-key cost."""
    import yaml

    with open(path) as f:
        r = yaml.safe_load(f)["revisited"]
    return p.replace(network_efficiency=float(r["network_efficiency"]),
                     per_key_s=float(r["per_key_s"]))


@dataclass(frozen=True)
class Prediction:
    devices: int
    machines: int
    t_compute: float
    t_intra: float
    t_ps: float
    t_keys: float
    t_step: float
    img_s: float
    efficiency: float


def layout(devices: int, p: Params, per_machine: int | None = None) -> tuple[int, int]:
    """``(machines, devices per machine)``: fill one machine first, as MXNet's benchmark did
    (machines of ``per_machine`` devices if given, else the YAML's)."""
    g = min(devices, per_machine or p.devices_per_machine)
    if devices % g:
        raise ValueError(f"{devices} devices do not fill machines of {p.devices_per_machine}")
    return devices // g, g


def predict(devices: int, p: Params, overlap: float | None = None,
            per_machine: int | None = None) -> Prediction:
    """images/s and efficiency of ``devices`` devices per the module formulas."""
    o = p.overlap if overlap is None else overlap
    m, g = layout(devices, p, per_machine)
    s_bytes = p.params_bytes
    t_c = p.t_compute
    t_intra = 0.0
    if g > 1:
        t_intra = (2 * min(p.devices_per_link, g) * s_bytes * (g - 1) / g
                   / (p.intra_gbyte_s * 1e9))
    t_ps = 0.0
    if m > 1:
        if p.placement == "colocated":
            t_ps = 2 * s_bytes * (m - 1) / m / p.net_bytes_s
        else:
            s = max(p.dedicated_servers, 1)
            t_ps = 2 * max(s_bytes, m * s_bytes / s) / p.net_bytes_s
    t_keys = p.keys * p.per_key_s if m > 1 else 0.0
    t = t_c + max(0.0, t_intra + t_ps + t_keys - o * p.backward_fraction * t_c)
    img_s = m * g * p.batch_per_device / t
    return Prediction(devices, m, t_c, t_intra, t_ps, t_keys, t, img_s,
                      img_s / (devices * p.single_device_img_s))


def compare(p: Params) -> list[dict[str, Any]]:
    """Published vs predicted (no overlap, and the YAML's overlap) for each published row."""
    rows = []
    for gpus, pub in zip(p.published_gpus, p.published_img_s, strict=True):
        no = predict(gpus, p, overlap=0.0)
        yo = predict(gpus, p)
        rows.append({"gpus": gpus, "machines": no.machines, "published_img_s": pub,
                     "published_eff": pub / (gpus * p.single_device_img_s),
                     "t_intra_ms": 1e3 * no.t_intra, "t_ps_ms": 1e3 * no.t_ps,
                     "pred_img_s_no_overlap": no.img_s, "pred_eff_no_overlap": no.efficiency,
                     "pred_img_s": yo.img_s, "pred_eff": yo.efficiency,
                     "pred_over_published_no_overlap": no.img_s / pub,
                     "pred_over_published": yo.img_s / pub})
    return rows


def what_if(p: Params, gpus: int = 128) -> list[list[str]]:
    """The 128-GPU prediction (no overlap) under other networks and server placements."""
    cases = [
        ("as published: co-located, 2 servers/machine, 20 Gbit/s", p),
        ("co-located, 25 Gbit/s (AWS's current p2.16xlarge figure)",
         p.replace(network_gbit_s=25.0)),
        ("co-located, 10 Gbit/s", p.replace(network_gbit_s=10.0)),
        ("1 dedicated server machine, 20 Gbit/s",
         p.replace(placement="dedicated", dedicated_servers=1)),
        ("8 dedicated server machines, 20 Gbit/s",
         p.replace(placement="dedicated", dedicated_servers=8)),
    ]
    rows = []
    for label, q in cases:
        r = predict(gpus, q, overlap=0.0)
        rows.append([label, f"{1e3 * r.t_ps:.0f}", f"{r.img_s:.0f}", f"{100 * r.efficiency:.1f}%"])
    return rows


def markdown(p: Params, path: str | Path = DEFAULT_YAML) -> str:
    rows = compare(p)
    table = md_table(
        ["GPUs", "machines", "published img/s", "published eff.", "t_intra ms", "t_ps ms",
         "predicted img/s (o=0)", "eff. (o=0)", f"predicted img/s (o={p.overlap:g})",
         "predicted ÷ published (o=0)"],
        [[r["gpus"], r["machines"], f"{r['published_img_s']:.1f}",
          f"{100 * r['published_eff']:.1f}%", f"{r['t_intra_ms']:.1f}", f"{r['t_ps_ms']:.1f}",
          f"{r['pred_img_s_no_overlap']:.1f}", f"{100 * r['pred_eff_no_overlap']:.1f}%",
          f"{r['pred_img_s']:.1f}", f"{r['pred_over_published_no_overlap']:.3f}"]
         for r in rows])
    at = next(r for r in rows if r["gpus"] == 128)
    one = max((r for r in rows if r["machines"] == 1), key=lambda r: r["gpus"])
    gap = 1 - at["published_img_s"] / at["pred_img_s_no_overlap"]
    drop_pub = one["published_eff"] - at["published_eff"]
    drop_pred = one["pred_eff_no_overlap"] - at["pred_eff_no_overlap"]
    lines = [
        f"{p.name}: S = {p.params_bytes / 1e6:.0f} MB, n = {p.batch_per_device}, "
        f"x₁ = {p.single_device_img_s} img/s (t_c = {1e3 * p.t_compute:.0f} ms), "
        f"{p.devices_per_machine} GPUs per p2.16xlarge, NIC {p.network_gbit_s:g} Gbit/s per "
        f"direction × {p.network_efficiency:g}, PCIe {p.intra_gbyte_s:g} GB/s per link shared "
        f"by {p.devices_per_link}, servers {p.placement} ({p.servers_per_machine} per machine). "
        f"1–{p.devices_per_machine} GPUs are one machine with the `device` store; more are "
        "whole machines on dist_device_sync.",
        "", table, "",
        f"At 128 GPUs ({at['machines']} machines) communication is small next to K80 compute: "
        f"t_ps = {at['t_ps_ms']:.0f} ms and t_intra = {at['t_intra_ms']:.0f} ms against "
        f"t_c = {1e3 * p.t_compute:.0f} ms. Even with no overlap at all the model predicts "
        f"{at['pred_img_s_no_overlap']:.0f} img/s ({100 * at['pred_eff_no_overlap']:.1f}% "
        f"efficiency) where {at['published_img_s']:.0f} ({100 * at['published_eff']:.1f}%) was "
        f"measured, {100 * gap:.1f}% fewer; with MXNet's overlap (o = {p.overlap:g}) it predicts "
        "perfect scaling. The network part is not what the model misses: from "
        f"{one['gpus']} GPUs (one machine) to 128 the published efficiency falls by "
        f"{100 * drop_pub:.1f} points and the no-overlap model's by {100 * drop_pred:.1f}. The "
        f"miss is already there on one machine without any network ({one['gpus']} GPUs: "
        f"{100 * one['published_eff']:.1f}% published, {100 * one['pred_eff_no_overlap']:.1f}% "
        "predicted): what a bandwidth model leaves out, synchronisation (each step waits for "
        "the slowest of 16–256 GPUs) and host-side work per step, costs more than the bytes.",
        "", "What-if at 128 GPUs (no overlap): where the network would start to matter",
        "", md_table(["setup", "t_ps ms", "img/s", "efficiency"], what_if(p)),
        "", "Sources of the published figures and the model's parameters: "
        "benchmarks/README.md and benchmarks/scale_model.yaml.",
        "", revisited_markdown(path),
    ]
    return "\n".join(lines)


def revisited_rows(path: str | Path = DEFAULT_YAML) -> list[dict[str, Any]]:
    """Inception-v3 and ResNet-50 on 128 GPUs as 8 × 16 (the table's machines) and 16 × 8, with
    the measured NIC efficiency and per-key cost, no overlap and the YAML's overlap."""
    out = []
    for model in ("model", "resnet50"):
        base = revisited(load(path, model), path)
        for per_machine in (16, 8):
            for label, keys in (("fused", base.keys), ("per key", base.tensors)):
                p = base.replace(keys=keys)
                no = predict(128, p, overlap=0.0, per_machine=per_machine)
                yo = predict(128, p, per_machine=per_machine)
                terms = {"t_intra": no.t_intra, "t_ps": no.t_ps, "t_keys": no.t_keys}
                published = dict(zip(p.published_gpus, p.published_img_s)).get(128)
                out.append({"model": p.name, "layout": f"{no.machines} × {per_machine}",
                            "keys": f"{keys} ({label})", "t_c_ms": 1e3 * no.t_compute,
                            **{f"{k}_ms": 1e3 * v for k, v in terms.items()},
                            "dominant": max(terms, key=lambda k: terms[k]),
                            "img_s_no_overlap": no.img_s, "eff_no_overlap": no.efficiency,
                            "img_s": yo.img_s, "eff": yo.efficiency,
                            "published_img_s": published if p.name == "inception-v3"
                            and per_machine == 16 else None})
    return out


def revisited_markdown(path: str | Path = DEFAULT_YAML) -> str:
    import yaml

    with open(path) as f:
        r = yaml.safe_load(f)["revisited"]
    rows = revisited_rows(path)
    table = md_table(
        ["model", "machines × GPUs", "keys", "t_c ms", "t_intra ms", "t_ps ms", "t_keys ms",
         "largest comm term", "img/s (o=0)", "eff. (o=0)", "img/s (o=1)", "published img/s"],
        [[x["model"], x["layout"], x["keys"], f"{x['t_c_ms']:.0f}", f"{x['t_intra_ms']:.1f}",
          f"{x['t_ps_ms']:.1f}", f"{x['t_keys_ms']:.1f}", x["dominant"],
          f"{x['img_s_no_overlap']:.0f}", f"{100 * x['eff_no_overlap']:.1f}%",
          f"{x['img_s']:.0f}", "—" if x["published_img_s"] is None
          else f"{x['published_img_s']:.0f}"] for x in rows])
    worst = max(rows, key=lambda x: x["t_keys_ms"])
    summary = (f"Compute dominates every row (t_c ≥ {min(x['t_c_ms'] for x in rows):.0f} ms); of "
               "the communication terms the parameter-server traffic t_ps is the largest "
               f"everywhere ({min(x['t_ps_ms'] for x in rows):.0f}–"
               f"{max(x['t_ps_ms'] for x in rows):.0f} ms), then the PCIe reduction; the per-key "
               f"cost is at most {worst['t_keys_ms']:.1f} ms ({worst['model']}, {worst['keys']}), "
               "so fusion matters for small nets and slow links, not for these. 16 × 8 has "
               "slightly more network traffic than 8 × 16 (more machines, (m−1)/m of S each) and "
               "a little less PCIe.")
    return "\n".join([
        "### Revisited with measured link efficiency and per-key cost",
        "",
        f"NIC efficiency {r['network_efficiency']:.3f} (ResNet-50 push+pull on the testbed, "
        f"W = S = 2, 1 Gbit/s: bound ÷ measured), per-key cost {1e6 * r['per_key_s']:.0f} µs per "
        f"key (demo net per key vs fused on the testbed); {r['source']}. ResNet-50's "
        "single-K80 training speed is an estimate (see scale_model.yaml).",
        "", table, "", summary])


def run(path: str | Path = DEFAULT_YAML) -> BenchResult:
    p = load(path)
    rows = compare(p)
    at = next(r for r in rows if r["gpus"] == 128)
    ratio = Ratio("scale_model_128", "scale model ÷ published images/s, Inception-v3 on 128 "
                  f"K80 GPUs (overlap o = {p.overlap:g})", [at["pred_over_published"]],
                  note="deterministic: one value; no-overlap variant "
                       f"{at['pred_over_published_no_overlap']:.3f}")
    ratio0 = Ratio("scale_model_128_no_overlap", "scale model (o = 0) ÷ published images/s, "
                   "Inception-v3 on 128 K80 GPUs", [at["pred_over_published_no_overlap"]],
                   note="deterministic: one value")
    rev = next(x for x in revisited_rows(path) if x["published_img_s"] is not None
               and x["keys"].endswith("(fused)"))
    ratio_rev = Ratio("scale_model_128_revisited", "scale model with the measured link "
                      "efficiency and per-key cost (o = 0, fused) ÷ published images/s, "
                      "Inception-v3 on 128 K80 GPUs", [rev["img_s_no_overlap"] /
                                                       rev["published_img_s"]],
                      note="deterministic: one value; the revisited table is in the section")
    return BenchResult("scale_model", [ratio, ratio0, ratio_rev],
                       {"rows": rows, "revisited": revisited_rows(path), "yaml": str(path)},
                       markdown(p, path))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    path = args[0] if args else DEFAULT_YAML
    print(markdown(load(path), path))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
