"""The Fielding family's strategies, as the registry lists them."""

from fedcluster_app.families.fielding.auxo import Auxo
from fedcluster_app.families.fielding.fielding import (
                                                       Fielding,
                                                       FieldingTau0,
                                                       FieldingTauInf,
                                                       StaticCFL,
)

STRATEGIES = [Fielding, FieldingTau0, FieldingTauInf, StaticCFL, Auxo]
