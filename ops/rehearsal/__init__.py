"""The ECS rehearsal: a local emulator of the ECS service scheduler's rolling deployments, driving
real flotilla node processes behind the real router with the settings of the synthesized templates
(`flotilla rehearse`, `make rehearse`; docs/rollouts.md, docs/runbooks/rehearse-a-rollout.md).

template.py reads cdk.out; ecs.py is the scheduler (each rule cites the ECS documentation it
follows); cloudformation.py orders service and stack updates; local.py runs the processes;
traffic.py loads the router and watches its rotation; run.py puts them together.
"""
