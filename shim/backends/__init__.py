"""Device backends: what moves bytes for each kind of device (see base.Backend)."""
