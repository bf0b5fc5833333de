"""C4P: plan a source port per collective flow so that the busiest fabric link carries as
little as possible (docs/planning.md). solver.py optimises, model.py translates between the
aggregator's view (topology, flows, path map, link health) and the solver, pathmap.py holds
what probes learned."""
