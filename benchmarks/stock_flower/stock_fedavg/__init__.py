"""Stock Flower FedAvg on fedcluster's mixture-swap data (the Ray path's reference)."""
