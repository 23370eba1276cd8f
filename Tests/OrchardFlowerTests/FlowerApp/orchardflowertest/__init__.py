"""A Flower app for Orchard's interop tests: FedAvg over the MLP in mlp.py."""
