"""The FedCCFA family's strategies, as the registry lists them."""

from fedcluster_app.families.fedccfa.fedccfa import FedBABU, FedCCFA, FedRep, Flash
from fedcluster_app.families.foundation.adaptive_fedavg import AdaptiveFedAvg

STRATEGIES = [FedCCFA, FedRep, FedBABU, Flash, AdaptiveFedAvg]
