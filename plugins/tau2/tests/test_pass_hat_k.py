"""toolrl eval's pass^k equals τ²-bench's own ``pass_hat_k`` (tau2.metrics.agent_metrics) for every
n <= 8 tries, c successes and k <= n."""

import itertools

import pytest
from tau2.metrics.agent_metrics import pass_hat_k as tau2_pass_hat_k
from toolrl.processes.evaluate import pass_hat_k


def test_pass_hat_k_equals_tau2_bench():
    for n in range(1, 9):
        for c, k in itertools.product(range(n + 1), range(1, n + 1)):
            assert pass_hat_k(n, c, k) == pytest.approx(tau2_pass_hat_k(n, c, k), abs=1e-12), (n, c, k)
