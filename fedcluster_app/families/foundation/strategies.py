"""The foundation family's strategies, as the registry lists them."""

from fedcluster_app.families.foundation.cfl import CFL, CFL3
from fedcluster_app.families.foundation.fedavg import FedAvg, FedProx
from fedcluster_app.families.foundation.ifca import IFCA
from fedcluster_app.families.foundation.local import Local
from fedcluster_app.families.foundation.oracle import Oracle

STRATEGIES = [FedAvg, FedProx, IFCA, Oracle, Local, CFL, CFL3]
