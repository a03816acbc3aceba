"""Video backbones: the :class:`Backbone` protocol and its :class:`Geometry` (see ``base``)."""

from cmbench.backbones.base import Backbone, Geometry

__all__ = ["Backbone", "Geometry"]
