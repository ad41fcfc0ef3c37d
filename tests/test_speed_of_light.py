"""Speed of light: the GPU table, each example task's work against a hand calculation, floors and fractions."""

from __future__ import annotations

import json
import math

import pytest
from conftest import REPO, SOFTMAX

from ksearch_graph.tasks.evaluation import EvalResult, Status, WorkloadResult
from ksearch_graph.tasks.gpu_specs import gpu_spec
from ksearch_graph.tasks.speed_of_light import SpeedOfLight, Work, fractions, task_work, work_from_json, work_to_json
from ksearch_graph.tasks.task import TaskError, load_task

GQA = REPO / "examples" / "gqa_paged_decode_h32_kv4_d128_ps1"
TRIMUL = REPO / "examples" / "trimul"
EXAMPLES = ["softmax", "trimul", "gqa_paged_decode_h32_kv4_d128_ps1", "mla_paged_decode_h16_ckv512_kpe64_ps1",
            "mla_paged_prefill_causal_h16_ckv512_kpe64_ps1",
            "moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048"]
H100 = "NVIDIA H100 80GB HBM3"


@pytest.mark.parametrize("name, model, bandwidth_tb", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 3.35), ("H100", "H100 SXM", 3.35), ("NVIDIA H100 PCIe", "H100 PCIe", 2.0),
    ("NVIDIA H100 NVL", "H100 NVL", 3.9), ("NVIDIA H200", "H200 SXM", 4.8), ("NVIDIA B200", "B200", 8.0),
    ("NVIDIA A100-SXM4-80GB", "A100 SXM 80GB", 2.039), ("NVIDIA A100-SXM4-40GB", "A100 SXM 40GB", 1.555),
    ("NVIDIA A100 80GB PCIe", "A100 PCIe 80GB", 1.935), ("NVIDIA L40S", "L40S", 0.864), ("NVIDIA L4", "L4", 0.3),
])
def test_known_gpus_by_the_names_evaluations_record(name, model, bandwidth_tb):
    spec = gpu_spec(name)
    assert spec.name == model and spec.bandwidth == pytest.approx(bandwidth_tb * 1e12)
    assert spec.source.startswith("NVIDIA")


def test_unknown_gpus_and_the_cpu_have_no_figures():
    assert gpu_spec("cpu") is None and gpu_spec(None) is None and gpu_spec("NVIDIA GeForce RTX 4090") is None
    a100 = gpu_spec("NVIDIA A100-SXM4-40GB")
    assert a100.peak_flops("fp8") == a100.peak_flops("bf16") == 312e12  # no FP8 units: the next slower kind


@pytest.fixture(scope="module")
def work():
    return {name: task_work(load_task(REPO / "examples" / name)) for name in EXAMPLES}


def test_every_example_has_the_work_of_every_timed_workload(work):
    for name in EXAMPLES:
        task = load_task(REPO / "examples" / name)
        timed = {w.name for w in task.spec.workloads if w.timed}
        assert set(work[name]) == timed, name
        assert all(isinstance(w, Work) and w.bytes > 0 for w in work[name].values()), (name, work[name])
    assert work["softmax"]["16x300"].source == "derived from the reference"
    assert work["trimul"]["bench-N256-B2-D128-normal-nomask"].source == "derived from the reference"
    assert work["gqa_paged_decode_h32_kv4_d128_ps1"]["b1_len4096"].source == "reference speed_of_light()"


def test_gqa_work_and_floor_by_hand(work):
    """b1_len16384 on an H100 SXM: the K and V rows of 16384 pages (4 KV heads x 128 x bf16 each), q and output
    (32 x 128 bf16), lse (32 fp32), 16384 page ids and 2 indptr entries (int32)."""
    w = work["gqa_paged_decode_h32_kv4_d128_ps1"]["b1_len16384"]
    by_hand = 16384 * 4 * 128 * 2 * 2 + 2 * 32 * 128 * 2 + 32 * 4 + 16384 * 4 + 2 * 4
    assert w.bytes == by_hand == 33_636_488
    assert w.flops == 4 * 32 * 128 * 16384 and w.compute == "bf16"
    floor = SpeedOfLight(H100, {"b1_len16384": w}).floors()["b1_len16384"]
    assert floor.bound == "memory" and floor.floor_us == pytest.approx(by_hand / 3.35e12 * 1e6)  # 10.04 us
    assert floor.floor_us == pytest.approx(10.04, abs=0.01)


def test_trimul_work_derived_from_the_reference_matches_the_hand_calculation(work):
    """bench-N1024-B1-D384: flops = B N^2 (2*5*H*D projections + 2*H*D output) + 2 B H N^3 contraction; bytes =
    x, mask and the weights read, y written (all fp32)."""
    n, b, d, h = 1024, 1, 384, 128
    w = work["trimul"]["bench-N1024-B1-D384-normal-nomask"]
    assert w.flops == b * n * n * 12 * h * d + 2 * b * h * n ** 3 == 893_353_197_568
    weights = (5 * h * d + d * h + 2 * d + 2 * h) * 4
    assert w.bytes == b * n * n * d * 4 * 2 + b * n * n * 4 + weights
    assert w.compute == "fp16"  # the tolerance (2e-2) leaves room for 16-bit tensor cores
    floor = SpeedOfLight(H100, {"x": w}).floors()["x"]
    assert floor.memory_us == pytest.approx(w.bytes / 3.35e12 * 1e6)
    assert floor.compute_us == pytest.approx(w.flops / 989.4e12 * 1e6)
    assert floor.floor_us == pytest.approx(963.2, abs=0.1) and floor.bound == "memory"


def test_moe_work_counts_only_the_selected_experts(work):
    moe = work["moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048"]
    big = moe["T4096_off0_hot_local"]
    per_expert = 3 * 2048 * 7168 + 4 * (32 + 16) * 56
    experts = int(big.note.split()[0])
    assert 1 <= experts <= 32 and big.compute == "fp8"
    assert big.bytes == 4096 * 256 * 4 + 256 * 2 + 4096 * 7168 * 3 + 4 * 4096 * 56 + experts * per_expert


def _result(latencies: dict[str, float], gpu: str = H100, **kw) -> EvalResult:
    return EvalResult(status=Status.passed, timing_representative=True, score=1.0,
                      environment={"device": "cuda", "gpu": gpu, **kw},
                      workloads=[WorkloadResult(workload=n, correct=True, latency_us=us) for n, us in latencies.items()])


def test_fractions_and_the_implausible_flag():
    work = {"a": Work(3_350_000, 0, "bf16", "task.json"), "b": Work(0, 989_400_000, "bf16", "task.json")}
    fr = fractions(_result({"a": 4.0, "b": 0.5}), work)  # floors: a 1 us (memory), b 1 us (compute)
    assert fr.per_workload == pytest.approx({"a": 0.25, "b": 2.0})
    assert fr.fraction == pytest.approx(math.sqrt(0.25 * 2.0))
    assert fr.implausible == ["b"] and fr.gpu == "H100 SXM"
    # The GPU is the one the result was measured on: an H200's floors are lower.
    assert fractions(_result({"a": 4.0}, gpu="NVIDIA H200"), work).per_workload["a"] == pytest.approx(
        3_350_000 / 4.8e12 * 1e6 / 4.0)
    cpu = _result({"a": 4.0}).model_copy(update={"timing_representative": False,
                                                 "environment": {"device": "cpu", "triton_interpret": True}})
    assert fractions(cpu, work) is None and fractions(_result({"a": 1.0}, gpu="RTX 9999"), work) is None


def test_work_round_trips_through_the_store_format(work):
    data = json.loads(json.dumps(work_to_json(work["gqa_paged_decode_h32_kv4_d128_ps1"])))
    assert work_from_json(data) == work["gqa_paged_decode_h32_kv4_d128_ps1"]


def test_declared_work_in_task_json(tmp_path):
    import shutil

    task_dir = tmp_path / "softmax"
    shutil.copytree(SOFTMAX, task_dir)
    spec = json.loads((task_dir / "task.json").read_text())
    spec["workloads"][0]["work"] = {"bytes": 1000, "flops": 2000, "compute": "fp32"}
    (task_dir / "task.json").write_text(json.dumps(spec))
    w = task_work(load_task(task_dir))[spec["workloads"][0]["name"]]
    assert (w.bytes, w.flops, w.compute, w.source) == (1000, 2000, "fp32", "task.json")
    spec["workloads"][0]["work"] = {"bytes": -1, "flop": 3}
    (task_dir / "task.json").write_text(json.dumps(spec))
    with pytest.raises(TaskError, match="work"):
        load_task(task_dir)


def test_a_reference_that_needs_data_gives_a_reason_not_a_crash(tmp_path):
    import shutil

    task_dir = tmp_path / "gqa"
    shutil.copytree(GQA, task_dir)
    source = (task_dir / "reference.py").read_text().replace("def speed_of_light(", "def _unused(")
    (task_dir / "reference.py").write_text(source)
    work = task_work(load_task(task_dir))
    assert all(isinstance(w, str) and "declare the work" in w for w in work.values())


def test_sol_check_agrees_with_the_hand_calculation_without_a_gpu(tmp_path):
    """tools/sol_check.py in its degraded mode (no GPU): every GQA and TriMul floor worked out by hand equals
    ksearch's; on a CUDA host the same command also measures the seeds (the lead's GPU check)."""
    import subprocess
    import sys

    out = tmp_path / "sol.json"
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "sol_check.py"), "--no-evaluate", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(out.read_text())
    assert data["agree"] and len(data["rows"]) == 14 + 7
    row = next(r for r in data["rows"] if r["workload"] == "b1_len16384")
    assert row["bytes"] == 33_636_488 and row["floor_us"] == pytest.approx(10.041, abs=1e-3)


def test_work_is_derived_for_kernelbench_and_flashinfer_trace_tasks(tmp_path, capfd):
    """Module tasks (KernelBench) and FlashInfer-Trace definitions get their work derived, quietly."""
    from ksearch_graph.tasks.flashinfer_trace_task import materialise_definition
    from ksearch_graph.tasks.kernelbench import materialise_problem

    data = REPO / "tests" / "data"
    kb = task_work(load_task(materialise_problem(data / "kernelbench" / "1_Linear_ReLU.py", tmp_path / "kb")))
    assert all(isinstance(w, Work) and w.bytes > 0 and w.flops > 0 for w in kb.values())
    fi = task_work(load_task(materialise_definition(
        data / "flashinfer_trace" / "definitions" / "rmsnorm" / "rmsnorm_h64.json", tmp_path / "fi")))
    assert fi and all(isinstance(w, Work) and w.bytes > 0 for w in fi.values())
    assert "fake_tensor" not in capfd.readouterr().err  # torch's logs of the first way tried are kept quiet
