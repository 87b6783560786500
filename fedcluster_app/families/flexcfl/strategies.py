"""The FlexCFL family's strategies, as the registry lists them."""

from fedcluster_app.families.flexcfl.flexcfl import (FedGroup, FeSEM, FeSEMMig, FlexCFL,
                                                     FlexFedAvg, FlexIFCA, FlexIFCAMig)

STRATEGIES = [FlexCFL, FedGroup, FeSEM, FlexIFCA, FlexFedAvg, FlexIFCAMig, FeSEMMig]
