"""Export: the wire contract, the export sequence, the StableHLO bundle, provenance,
and loading a bundle back (`export_model`, `StableHLOBundle`, `load_bundle`)."""
