"""draftheads.data"""

from draftheads.conf.moved import install

install()
