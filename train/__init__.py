"""draftheads.train"""

from draftheads.conf.moved import install

install()
