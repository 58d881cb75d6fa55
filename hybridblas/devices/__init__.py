"""Devices a hybrid call can run on. CUDA devices are imported only when asked for."""
from .base import Device, DeviceRun, register, registered
from .cpu import CPUDevice

__all__ = ["Device", "DeviceRun", "CPUDevice", "register", "registered"]
