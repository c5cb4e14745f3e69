"""The scaler: whole units started and drained as demand moves, from what the routers see.

`decide()` (decide.py) is one pure function that the cloud runner (aws.py), `make local --scaler`
(local.py) and the fleet simulation (bench/scaler/) all call. Standard library only: no torch, no
boto3 at import time.
"""
