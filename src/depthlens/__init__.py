"""depthlens: a trained transformer language model as a dynamical system over depth."""

__version__ = "0.1.0"
