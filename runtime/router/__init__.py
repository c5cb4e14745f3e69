"""The proxy layer in front of the units: discovers unit leaders, polls their health and load,
routes each request to the least-loaded ready unit, sheds load, and drains on SIGTERM."""
