"""draftheads.data"""
