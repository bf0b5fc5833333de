"""c4.lab: the simulator, scoring against ground truth, and the network-namespace lab."""
