"""INSTANCES: the engine children on this node: the supervisor, where a model is placed (decide, then act),
reconciliation at start-up, the KV bank, calibration and RPC workers."""
