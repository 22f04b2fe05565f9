"""Caffe frontend: deploy ``.prototxt`` (protobuf text format) and ``.caffemodel`` weights -> Graph.

No protobuf compiler and no caffe package: ``prototxt`` parses the text format, ``caffemodel`` decodes
the binary wire format of the few ``NetParameter`` fields that hold weights, ``layers`` maps each layer
type to hetflow ops, and ``net`` puts a whole net together.
"""

from hetflow.frontends.caffe.caffemodel import CaffeWeights, decode_caffemodel, read_caffemodel
from hetflow.frontends.caffe.layers import LAYERS, caffe_pooled_size
from hetflow.frontends.caffe.net import convert_net, import_caffe
from hetflow.frontends.caffe.prototxt import Message, parse_prototxt

#: File suffixes the Caffe frontend reads.
PROTOTXT_SUFFIXES = (".prototxt",)
CAFFEMODEL_SUFFIX = ".caffemodel"

__all__ = [
    "CAFFEMODEL_SUFFIX",
    "LAYERS",
    "PROTOTXT_SUFFIXES",
    "CaffeWeights",
    "Message",
    "caffe_pooled_size",
    "convert_net",
    "decode_caffemodel",
    "import_caffe",
    "parse_prototxt",
    "read_caffemodel",
]
