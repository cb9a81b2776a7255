"""multiact: activations forward and backward on any device."""
