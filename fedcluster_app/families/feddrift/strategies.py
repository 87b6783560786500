"""The FedDrift family's strategies, as the registry lists them."""

from fedcluster_app.families.feddrift.baselines import (AUE, CFL, CFLW, IFCAT, IFCAW, KUE,
                                                        AdaptiveFedAvg, DriftSurf, WeightedExp,
                                                        WeightedLinear)
from fedcluster_app.families.feddrift.feddrift import (FedDrift, FedDriftC, FedDriftEager,
                                                       FedDriftEagerW, FedDriftW)
from fedcluster_app.families.feddrift.protocol import Oblivious, OracleT, OracleW, Window, Window2

STRATEGIES = [FedDriftEager, FedDrift, FedDriftC, FedDriftEagerW, FedDriftW, Oblivious, Window,
              Window2, OracleT, OracleW, KUE, IFCAT, IFCAW, WeightedLinear, WeightedExp,
              AdaptiveFedAvg, CFL, CFLW, DriftSurf, AUE]
