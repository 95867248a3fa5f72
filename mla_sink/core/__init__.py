"""The pipeline's stages: records, dtypes, platform, validate, describe, select, plan, the float64 reference,
the LSE algebra and decode context parallel (see docs/DESIGN.md, "Architecture")."""
