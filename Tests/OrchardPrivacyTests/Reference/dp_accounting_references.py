#!/usr/bin/env python3
"""The reference values of RDPAccountantTests, computed with Google's dp-accounting 0.6.0 (PyPI, Apache-2.0).

    python3 -m venv venv && venv/bin/pip install dp-accounting==0.6.0 && venv/bin/python dp_accounting_references.py

RdpAccountant with its default orders (DEFAULT_RDP_ORDERS: 1.1 to 10.9 in tenths, 11 to 63, 128, 256, 512, 1024)
composes PoissonSampledDpEvent(q, GaussianDpEvent(z)) T times; get_epsilon_and_optimal_order(δ) gives ε and the order.
Prints one Swift `Reference(...)` line per case, pasted into RDPAccountantTests.swift.
"""
import dp_accounting
from dp_accounting.rdp import rdp_privacy_accountant as rdp

CASES = [
    # Literature settings: Abadi et al. 2016; McMahan et al. 2018 (cross-device); small-noise extremes.
    (0.01, 1.1, 10000, 1e-5),
    (0.001, 1.0, 100000, 1e-6),
    (1e-5, 1.0, 1000, 1e-5),
    (0.1, 0.7, 100, 1e-5),
    (0.01, 0.3, 100, 1e-5),
    (1.0, 1.0, 1, 1e-5),
    (0.1, 1.0, 100, 1e-5),
    (0.004, 4.0, 10000, 1e-5),
    (1e-5, 0.7, 100, 1e-5),
    (1e-5, 0.3, 100, 1e-5),
    # Small sampling rates with noise multipliers between 0.5 and 1, where the optimum falls between integer orders.
    (1e-3, 0.5, 1000, 1e-5),
    (1e-3, 0.6, 10000, 1e-6),
    (1e-3, 0.8, 3000, 1e-5),
    (5e-4, 0.7, 20000, 1e-6),
    (1e-4, 0.5, 50000, 1e-5),
    (1e-4, 0.9, 100000, 1e-6),
    (1e-4, 1.0, 10000, 1e-5),
    (2e-4, 0.6, 5000, 1e-5),
]

for q, z, steps, delta in CASES:
    accountant = rdp.RdpAccountant()
    accountant.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), steps)
    epsilon, order = accountant.get_epsilon_and_optimal_order(delta)
    print(f"Reference(q: {q!r}, z: {z!r}, steps: {steps}, delta: {delta!r}, epsilon: {float(epsilon)!r}, order: {float(order)!r}),")
