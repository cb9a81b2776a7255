"""The backend modules, one per way of running the kernels (`<name>_backend.py`), and what they share; the
registry (multiact.registry) imports them by name when a call first needs one."""
