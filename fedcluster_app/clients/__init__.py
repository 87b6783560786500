"""Clients: NumPyClient subclasses over streaming local datasets."""

from .stream_client import StreamClient

__all__ = ["StreamClient"]
