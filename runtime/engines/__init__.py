"""Engines: the code that turns token ids into token streams, sharded across a unit's ranks."""
