"""The FedDrift family's strategies, as the registry lists them."""

from fedcluster_app.families.feddrift.baselines import (
                                                        AUE,
                                                        CFLT,
                                                        CFLW,
                                                        IFCAT,
                                                        IFCAW,
                                                        KUE,
                                                        AdaptiveFedAvgT,
                                                        DriftSurf,
                                                        Oblivious,
                                                        OracleT,
                                                        OracleW,
                                                        WeightedExp,
                                                        WeightedLinear,
                                                        Window,
                                                        Window2,
)
from fedcluster_app.families.feddrift.feddrift import (
                                                        FedDrift,
                                                        FedDriftC,
                                                        FedDriftEager,
                                                        FedDriftEagerW,
                                                        FedDriftW,
)

STRATEGIES = [FedDriftEager, FedDrift, FedDriftC, FedDriftEagerW, FedDriftW, Oblivious, Window,
              Window2, OracleT, OracleW, KUE, IFCAT, IFCAW, WeightedLinear, WeightedExp,
              AdaptiveFedAvgT, CFLT, CFLW, DriftSurf, AUE]
