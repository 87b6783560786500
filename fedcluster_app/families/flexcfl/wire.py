"""The FlexCFL family's wire keys, shared by its strategies and its client handler."""

QUERY_PRETRAIN = "query.pretrain"   # pre-train from the model sent (w0); reply: it and the counts
PRETRAIN_ITERS = "pretrain-iters"   # minibatch steps of the pre-training
