"""draftheads.decode"""
