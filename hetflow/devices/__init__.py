"""Devices: where kernels run. ``registry`` is the one list of device packages."""
