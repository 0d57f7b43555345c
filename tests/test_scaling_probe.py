"""Eq. 9 probe and the Table IV communication model."""
import math

import pytest

from trainopt_core.reproduction.scaling import RingAllReduceModel, fit_ring_model, gradient_bytes, modelled_throughput


def test_ring_allreduce_cost_formula():
    comm = RingAllReduceModel(bandwidth_bytes_per_s=1e9, latency_s=1e-5, source="test")
    assert comm.allreduce_s(1, 1e9) == 0.0
    # 2(n-1)/n · V/β + 2(n-1)·α
    assert comm.allreduce_s(4, 4e8) == pytest.approx(2 * 3 / 4 * 0.4 + 6 * 1e-5)
    assert gradient_bytes(1000, "fp32") == 4000 and gradient_bytes(1000, "bf16") == 2000


def test_fit_inverts_the_cost_formula():
    truth = RingAllReduceModel(2e9, 3e-5, "truth")
    probe = [(4, truth.allreduce_s(2, 4)), (2**24, truth.allreduce_s(2, 2**24))]
    fitted = fit_ring_model(probe, 2)
    assert fitted.bandwidth_bytes_per_s == pytest.approx(2e9, rel=1e-3)
    assert fitted.latency_s == pytest.approx(3e-5, rel=1e-2)


def test_accumulation_and_reduced_precision_improve_modelled_efficiency():
    comm = RingAllReduceModel(1e9, 1e-4, "test")
    params = 25_000_000

    def efficiency(k, precision, n=4):
        per_micro_s, items_per_micro = 0.1, 32
        t1 = modelled_throughput(compute_s_per_step=k * per_micro_s, items_per_step_per_replica=k * items_per_micro,
                                 world_size=1, num_parameters=params, precision=precision, comm=comm)
        tn = modelled_throughput(compute_s_per_step=k * per_micro_s, items_per_step_per_replica=k * items_per_micro,
                                 world_size=n, num_parameters=params, precision=precision, comm=comm)
        return tn / (n * t1)

    assert efficiency(1, "fp32") < efficiency(4, "fp32") < efficiency(8, "fp32") < 1
    assert efficiency(4, "fp32") < efficiency(4, "bf16")
    assert math.isclose(efficiency(4, "fp32", n=1), 1.0)


@pytest.mark.slow
def test_eq9_probe_reports_every_k_and_the_argmax():
    from trainopt_core.reproduction.probe import probe_accumulation_steps

    result = probe_accumulation_steps("cifar10", "smoke", ks=(1, 4), data_policy="standin", timed_steps=1)
    rows = result["rows"]
    assert [r["k"] for r in rows] == [1, 4] and [r["micro_batch_size"] for r in rows] == [32, 8]
    assert rows[1]["peak_memory_bytes"] < rows[0]["peak_memory_bytes"]  # eq. 8: smaller micro-batch
    assert result["k_optimal"] == max(rows, key=lambda r: r["throughput_per_gib"])["k"]
    with pytest.raises(ValueError, match="ks="):
        probe_accumulation_steps("cifar10", "smoke", ks=(3,), data_policy="standin")
