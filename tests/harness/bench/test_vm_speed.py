"""The VM's matmul rate around each system of a sweep: the drift and the report's lines."""

from harness.bench.serve import vm_speed


def row(system, before, after):
    return {"system": system, "status": "ok", "vm_speed": {"before": {"bf16_tflops": before, "fp32_tflops": 0.1},
                                                           "after": {"bf16_tflops": after, "fp32_tflops": 0.1}}}


def test_a_steady_vm_is_reported_without_a_warning():
    rows = [row("pdbus-disagg", 1.0, 1.1), row("vllm", 1.05, 1.0)]
    assert vm_speed.drift(rows) == 1.1
    text = vm_speed.text(rows)
    assert "pdbus-disagg: 1.00 -> 1.10" in text and "vllm: 1.05 -> 1.00" in text
    assert "measure the VM" not in text


def test_a_vm_that_slowed_between_systems_is_flagged():
    rows = [row("pdbus-disagg", 1.11, 0.9), row("vllm", 0.9, 0.4)]
    assert abs(vm_speed.drift(rows) - 1.11 / 0.4) < 1e-9
    assert "the rate moved 2.7" in vm_speed.text(rows) and "measure the VM" in vm_speed.text(rows)


def test_rows_without_probes_say_nothing():
    assert vm_speed.drift([{"system": "vllm", "status": "not installed"}]) is None
    assert vm_speed.text([{"system": "vllm", "status": "not installed"}]) == ""


def test_the_probe_measures_both_dtypes():
    speed = vm_speed.probe()
    assert speed["bf16_tflops"] > 0 and speed["fp32_tflops"] > 0
