"""The client half of the core: what a ClientApp runs for a message (the stream client over a
client's data, the handlers of the core's message kinds, the jobs they hand to the batched
engine, the compiled kernels). It never imports the server half (``core/server``)."""
