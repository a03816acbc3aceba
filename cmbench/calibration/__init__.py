"""Calibration: measurements on calibration contexts that configure a method before it is evaluated."""
