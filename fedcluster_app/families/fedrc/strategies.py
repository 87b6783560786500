"""The FedRC family's strategies, as the registry lists them."""

from fedcluster_app.families.fedrc.fedrc import FedEM, FedRC
from fedcluster_app.families.fedrc.fedsoft import FedSoft

STRATEGIES = [FedRC, FedEM, FedSoft]
