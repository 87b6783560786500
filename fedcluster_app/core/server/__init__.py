"""The server half of the core: what a ServerApp runs (the clustered-strategy base with its model
registry and round loop, the time-step protocols, building and checking messages, the
checkpoint). It never imports the client half (``core/client``)."""
