"""The FlexCFL family's strategies, as the registry lists them."""

from fedcluster_app.families.flexcfl.baselines import FlexFedAvg, FlexIFCA, FlexIFCAMig
from fedcluster_app.families.flexcfl.fesem import FeSEM, FeSEMMig
from fedcluster_app.families.flexcfl.flexcfl import FedGroup, FlexCFL

STRATEGIES = [FlexCFL, FedGroup, FeSEM, FlexIFCA, FlexFedAvg, FlexIFCAMig, FeSEMMig]
