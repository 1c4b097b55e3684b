"""draftheads.train"""
