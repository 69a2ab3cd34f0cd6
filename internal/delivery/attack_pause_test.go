package delivery
