"""Start-up hook for programs run by ``tracetool record`` (this folder goes on PYTHONPATH; see sitecustomize.py)."""
