"""The proxy layer (architecture §4 "Router"): discovers unit leaders, polls their health and load,
routes each request to the least-loaded ready unit, sheds load, and drains on SIGTERM."""
